"""Subscription patterns: globs over stream paths, whole segments at a time.

``*`` stands for exactly one path segment and ``**`` for zero or more; every
other segment matches itself. A ``*`` inside a segment (``user-*``) is refused
when the pattern is parsed rather than read literally, so that a pattern never
silently means something other than what its author expected. Matching is a
table over (pattern segment, path segment) pairs, so a hostile pattern of many
``**`` costs at most their product, never the exponential time of naive
backtracking.
"""

from __future__ import annotations

from dataclasses import dataclass

ONE = "*"
ANY = "**"
MAX_SEGMENTS = 64


class PatternError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Pattern:
    text: str
    segments: tuple[str, ...]

    @classmethod
    def parse(cls, text: str, *, max_bytes: int) -> Pattern:
        """The pattern, normalised: no leading or trailing slash, runs of ``**`` as one."""
        stripped = text.strip("/")
        if not stripped:
            raise PatternError("pattern is empty")
        if len(stripped.encode()) > max_bytes:
            raise PatternError(f"pattern longer than {max_bytes} bytes")
        segments: list[str] = []
        for seg in stripped.split("/"):
            if seg in ("", ".", ".."):
                raise PatternError("empty, '.' and '..' segments are not allowed in a pattern")
            if "*" in seg and seg not in (ONE, ANY):
                raise PatternError(f"'*' must be a whole segment ('*' or '**'), not {seg[:40]!r}")
            if any(c < " " or c == "\x7f" or c == "\\" for c in seg):
                raise PatternError("control characters and backslashes are not allowed")
            if seg == ANY and segments and segments[-1] == ANY:
                continue
            segments.append(seg)
        if len(segments) > MAX_SEGMENTS:
            raise PatternError(f"pattern has more than {MAX_SEGMENTS} segments")
        return cls("/".join(segments), tuple(segments))

    @property
    def literal_prefix(self) -> str:
        """The segments before the first wildcard: every match lies below this path."""
        out: list[str] = []
        for seg in self.segments:
            if seg in (ONE, ANY):
                break
            out.append(seg)
        return "/".join(out)

    def matches(self, path: str) -> bool:
        parts = path.split("/")
        pat = self.segments
        # reach[j]: the first i pattern segments can match the first j path segments.
        reach = [True] + [False] * len(parts)
        for seg in pat:
            nxt = [False] * (len(parts) + 1)
            if seg == ANY:
                seen = False
                for j in range(len(parts) + 1):
                    seen = seen or reach[j]
                    nxt[j] = seen
            else:
                for j in range(1, len(parts) + 1):
                    nxt[j] = reach[j - 1] and (seg == ONE or seg == parts[j - 1])
            reach = nxt
            if not any(reach):
                return False
        return reach[len(parts)]
