"""Build the project's three container images: durable-streams-server, -operator, -spark.

One script over 400 lines on purpose: the base, the inputs' digests, the wheels and the
builds are steps of one build that a user runs as one command, as the image tests
run it (testkit/images.py).

    python scripts/build_images.py                 # all three, podman (runc), base chosen below
    python scripts/build_images.py --engine docker --base public
    python scripts/build_images.py --only durable-streams-server --force --json

Why a script around ``podman build`` rather than three bare build commands:

- **Wheels are built on the host.** ``pip install`` inside a build cannot
  always reach or trust the package index a machine is configured with (a
  proxy with its own CA, local indexes); the host's pip can. The project
  and its dependencies become wheels in ``build/images/context/wheels``
  (from a clean copy of the sources, so no stale file in ``build/lib`` gets
  in), which the Containerfiles bind-mount and install with ``--no-index``.
- **The base is a build argument.** By default it is the public
  ``python:3.11-slim-bookworm`` image, so the Containerfiles build as they
  are on any Docker or Podman host. Where no registry can be reached,
  ``mmdebstrap`` makes a Debian bookworm base with Python 3.11 and tini,
  imported once and then reused (the Spark image adds Java with apt-get,
  as it does on the public base).
- **Unchanged images are not rebuilt.** Each image carries a label with a
  digest of everything it is built from (its Containerfile, the project's
  sources, this script, its base image's id); an image whose label matches
  is reused, so the tests can ask for the images every session at little
  cost.
- **The dependencies are a layer of their own.** A change to the sources
  (the common case: every commit) rebuilds only the layer that installs the
  project's wheel; the layer below it, the dependencies (pyspark, pyarrow,
  boto3...: nearly all of an image's bytes and of its build's CPU), is keyed
  on the project's requirements and the base (``DEPS``), and the dependency
  wheels on the host are kept for as long as those requirements hold, so
  only the project's own wheel is built again. ``--no-cache`` builds all of
  them afresh.

Prints one line per image (reused or built, seconds, size); ``--json``
prints the same as JSON on stdout for a caller (tests/images/conftest.py).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
IMAGES_DIR = ROOT / "images"
WORK = ROOT / "build" / "images"
CONTEXT = WORK / "context"

# Image name -> the extra it installs.
IMAGES: dict[str, str] = {
    "durable-streams-server": "server",
    "durable-streams-operator": "operator",
    "durable-streams-spark": "spark",
}
PUBLIC_BASE = "docker.io/library/python:3.11-slim-bookworm"
INPUTS_LABEL = "dev.pyds.inputs"
RECIPE_LABEL = "dev.pyds.recipe"

# The Debian base made with mmdebstrap: what the server and operator Containerfiles would
# otherwise install with apt-get (they skip that when the base has it). The Spark
# Containerfile installs Java with apt-get on this base as on the public one (a cached layer).
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "python3-venv", "tini", "passwd")
DEBIAN_BASE = f"localhost/durable-streams-base:{DEBIAN_SUITE}-python"
# Files in the images' build context besides the wheels.
CONTEXT_FILES = ("spark-entrypoint.sh",)
WHEEL_PREFIX = "durable_streams_py"  # the project's own wheel, built again every build
WHEELS_FOR = "wheels-for"  # the requirements digest the dependency wheels were built for
SKIP_PARTS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}


def log(message: str) -> None:
    print(f"build_images: {message}", file=sys.stderr, flush=True)


def project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


@dataclass(frozen=True)
class Engine:
    """podman (with an OCI runtime of choice) or docker, as one command prefix."""

    program: str
    runtime: str | None = None

    @classmethod
    def choose(cls, program: str | None, runtime: str | None) -> Engine:
        program = program or ("podman" if shutil.which("podman") else "docker")
        if shutil.which(program) is None:
            raise SystemExit(f"build_images: {program} is not installed (make system-deps)")
        if program == "podman" and not runtime:
            # Debian's default crun fails on hosts with hybrid cgroups; runc works everywhere.
            # Debian puts runc in /usr/sbin, which a user's PATH may lack.
            runtime = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin")
        return cls(program, runtime if program == "podman" else None)

    def cmd(self, *args: str) -> list[str]:
        head = [self.program]
        if self.runtime:
            head += ["--runtime", self.runtime]
        return [*head, *args]

    def run(self, *args: str, quiet: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cmd(*args),
            text=True,
            stdout=subprocess.PIPE if quiet else sys.stderr,
            stderr=subprocess.PIPE if quiet else None,
            check=False,
        )

    def inspect(self, ref: str) -> dict[str, Any] | None:
        """The image's inspect record, or None when there is no such image here."""
        proc = self.run("image", "inspect", ref, quiet=True)
        if proc.returncode != 0:
            return None
        found = json.loads(proc.stdout or "[]")
        return dict(found[0]) if found else None


def labels(record: dict[str, Any]) -> dict[str, str]:
    found = (record.get("Config") or {}).get("Labels") or record.get("Labels") or {}
    return dict(found)


def digest_of(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()[:32]


# ------------------------------------------------------------------ bases


def debian_base(engine: Engine) -> str:
    """A Debian bookworm base image made by mmdebstrap, reused while its recipe holds."""
    recipe = digest_of(DEBIAN_SUITE, "minbase", *DEBIAN_PACKAGES)
    found = engine.inspect(DEBIAN_BASE)
    if found is not None and labels(found).get(RECIPE_LABEL) == recipe:
        return DEBIAN_BASE
    if shutil.which("mmdebstrap") is None:
        raise SystemExit(
            "build_images: no registry for the public base and mmdebstrap is not installed "
            "(Debian's mmdebstrap and uidmap: make system-deps)"
        )
    WORK.mkdir(parents=True, exist_ok=True)
    tarball = WORK / "base.tar"
    log(f"making {DEBIAN_BASE} with mmdebstrap ({', '.join(DEBIAN_PACKAGES)})")
    started = time.monotonic()
    subprocess.run(
        [
            "mmdebstrap",
            "--quiet",
            "--variant=minbase",
            f"--include={','.join(DEBIAN_PACKAGES)}",
            # No docs, locales, apt lists or caches in the base: the images do not use them.
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            "--customize-hook=rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/*",
            DEBIAN_SUITE,
            str(tarball),
        ],
        check=True,
    )
    imported = engine.run(
        "import",
        "--change",
        f"LABEL {RECIPE_LABEL}={recipe}",
        str(tarball),
        DEBIAN_BASE,
        quiet=True,
    )
    tarball.unlink(missing_ok=True)
    if imported.returncode != 0:
        raise SystemExit(f"build_images: importing the base failed: {imported.stderr}")
    log(f"{DEBIAN_BASE} made in {time.monotonic() - started:.0f} s")
    return DEBIAN_BASE


def public_base_available(engine: Engine, *, pull: bool) -> bool:
    if engine.inspect(PUBLIC_BASE) is not None:
        return True
    return pull and engine.run("pull", "--quiet", PUBLIC_BASE, quiet=True).returncode == 0


def resolve_base(engine: Engine, mode: str) -> str:
    """The base: ``public``, ``debian``, ``auto`` (the public image when present or
    pullable, else the Debian base; a Debian base already made is preferred over a
    pull), or an image reference."""
    if mode == "auto":
        if public_base_available(engine, pull=False):
            mode = "public"
        elif engine.inspect(DEBIAN_BASE) is not None:
            mode = "debian"
        elif public_base_available(engine, pull=True):
            mode = "public"
        else:
            log(f"{PUBLIC_BASE} cannot be pulled: making a Debian base with mmdebstrap")
            mode = "debian"
    if mode == "public":
        if not public_base_available(engine, pull=True):
            raise SystemExit(f"build_images: cannot pull {PUBLIC_BASE}")
        return PUBLIC_BASE
    if mode == "debian":
        return debian_base(engine)
    return mode


# ------------------------------------------------------------------ inputs and wheels


def source_files() -> list[Path]:
    """Everything the project's wheel is built from."""
    files = [ROOT / "pyproject.toml", ROOT / "README.md"]
    for top in ("server", "operator"):
        for path in sorted((ROOT / top).rglob("*")):
            rel = path.relative_to(ROOT)
            if path.is_file() and not (
                SKIP_PARTS & set(rel.parts) or any(p.endswith(".egg-info") for p in rel.parts)
            ):
                files.append(path)
    return files


def inputs_digest(name: str, base_id: str) -> str:
    parts: list[bytes | str] = [name, base_id, Path(__file__).read_bytes()]
    for path in [
        IMAGES_DIR / f"{name}.Containerfile",
        *(IMAGES_DIR / f for f in CONTEXT_FILES),
        *source_files(),
    ]:
        parts += [str(path.relative_to(ROOT)), path.read_bytes()]
    return digest_of(*parts)


def requirements_digest() -> str:
    """What decides the dependency wheels and the images' dependency layers: the project's
    requirements (every extra an image installs) and the host's Python, which builds them."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    extras = project.get("optional-dependencies", {})
    wanted = {
        "python": list(sys.version_info[:2]),
        "requires-python": project.get("requires-python"),
        "dependencies": project.get("dependencies", []),
        "extras": {extra: extras.get(extra, []) for extra in sorted(set(IMAGES.values()))},
    }
    return digest_of(json.dumps(wanted, sort_keys=True))


def build_wheels(*, fresh: bool) -> None:
    """The project's wheel, from a clean copy of its sources, and its dependencies' wheels
    (every image's extra) in the build context.

    The dependency wheels stay from one build to the next while ``requirements_digest``
    holds (``WHEELS_FOR`` records it), so that a change to the sources builds one small
    wheel; ``fresh`` (or new requirements) builds them all again."""
    src, wheels = WORK / "src", CONTEXT / "wheels"
    stamp = CONTEXT / WHEELS_FOR
    requirements = requirements_digest()
    fresh = fresh or not stamp.exists() or stamp.read_text() != requirements
    shutil.rmtree(src, ignore_errors=True)
    if fresh:
        shutil.rmtree(CONTEXT, ignore_errors=True)
    for old in wheels.glob(f"{WHEEL_PREFIX}-*.whl"):
        old.unlink()
    src.mkdir(parents=True)
    for path in source_files():
        target = src / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    wheels.mkdir(parents=True, exist_ok=True)
    for name in CONTEXT_FILES:
        shutil.copy2(IMAGES_DIR / name, CONTEXT / name)
    extras = ",".join(sorted(set(IMAGES.values())))
    log(f"building {f'wheels for [{extras}]' if fresh else 'the project wheel'} on the host")
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-qq", "--disable-pip-version-check",
         *([] if fresh else ["--no-deps"]), "--wheel-dir", str(wheels), f"{src}[{extras}]"],
        check=True,
    )  # fmt: skip
    stamp.write_text(requirements)
    log(f"wheels built in {time.monotonic() - started:.0f} s")


# ------------------------------------------------------------------ images


@dataclass
class Result:
    name: str
    ref: str
    id: str
    size_bytes: int
    built: bool
    seconds: float
    base: str


class Plan(NamedTuple):
    """One image to have: its name, reference, base, the digest of its inputs and that of
    its dependency layer's (the requirements and the base)."""

    name: str
    ref: str
    base: str
    digest: str
    deps: str


def build_image(engine: Engine, plan: Plan, *, no_cache: bool) -> None:
    proc = engine.run(
        "build",
        *(["--no-cache"] if no_cache else []),
        "--file", str(IMAGES_DIR / f"{plan.name}.Containerfile"),
        "--build-arg", f"BASE={plan.base}",
        "--build-arg", f"VERSION={project_version()}",
        "--build-arg", f"DEPS={plan.deps}",
        "--build-arg", f"INPUTS={plan.digest}",
        "--label", f"{INPUTS_LABEL}={plan.digest}",
        "--tag", plan.ref,
        str(CONTEXT),
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"build_images: building {plan.ref} failed (exit {proc.returncode})")


def build(
    engine: Engine, base_mode: str, names: list[str], *, force: bool, no_cache: bool = False
) -> list[Result]:
    version = project_version()
    base = resolve_base(engine, base_mode)
    base_record = engine.inspect(base)
    if base_record is None:
        raise SystemExit(f"build_images: base image {base} not found")
    deps = digest_of(requirements_digest(), base_record["Id"])
    plans = [
        Plan(name, f"{name}:{version}", base, inputs_digest(name, base_record["Id"]), deps)
        for name in names
    ]

    def current(plan: Plan) -> bool:
        return labels(engine.inspect(plan.ref) or {}).get(INPUTS_LABEL) == plan.digest

    stale = {plan.name for plan in plans if force or not current(plan)}
    if stale:
        build_wheels(fresh=no_cache)
    results = []
    for plan in plans:
        started = time.monotonic()
        previous = engine.inspect(plan.ref)
        if plan.name in stale:
            log(f"building {plan.ref} on {plan.base}")
            build_image(engine, plan, no_cache=no_cache)
        record = engine.inspect(plan.ref)
        if record is None:
            raise SystemExit(f"build_images: {plan.ref} is missing after its build")
        if previous is not None and previous["Id"] != record["Id"]:
            # The image this build replaced, now untagged: removed unless a container uses it.
            engine.run("rmi", previous["Id"], quiet=True)
        results.append(
            Result(
                name=plan.name,
                ref=plan.ref,
                id=record["Id"],
                size_bytes=int(record.get("Size") or 0),
                built=plan.name in stale,
                seconds=round(time.monotonic() - started, 1),
                base=plan.base,
            )
        )
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["podman", "docker"], default=None,
                    help="default: podman when installed, else docker")  # fmt: skip
    ap.add_argument("--runtime", default=os.environ.get("PODMAN_RUNTIME"),
                    help="podman's OCI runtime (default: runc when installed)")  # fmt: skip
    ap.add_argument(
        "--base",
        default="auto",
        help="public | debian | auto (default: the public python image when present or "
        "pullable, else Debian bases made with mmdebstrap) | an image reference",
    )
    ap.add_argument("--only", action="append", choices=list(IMAGES), default=[],
                    help="build only this image (repeatable)")  # fmt: skip
    ap.add_argument("--force", action="store_true", help="rebuild even when unchanged")
    ap.add_argument(
        "--no-cache", action="store_true", help="with --force: without the engine's layer cache"
    )
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    args = ap.parse_args(argv)
    engine = Engine.choose(args.engine, args.runtime)
    started = time.monotonic()
    WORK.mkdir(parents=True, exist_ok=True)
    # One build at a time per tree: two would share build/images/context.
    with (WORK / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = build(
            engine, args.base, args.only or list(IMAGES), force=args.force, no_cache=args.no_cache
        )
    for r in results:
        how = f"built in {r.seconds:.0f} s" if r.built else "unchanged, reused"
        log(f"{r.ref}: {r.size_bytes / 1e6:.0f} MB, {how} (base {r.base})")
    log(f"done in {time.monotonic() - started:.0f} s")
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
