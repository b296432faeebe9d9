"""The object store an archive lives in: any S3-compatible one, through boto3.

Names given here are below the archive's prefix (``stream_format.archive`` builds
them). Every write is conditional (``If-None-Match: *``): an archive object is
written once and never replaced, so two servers that both believe they archive
(a deposed primary and its successor) cannot overwrite each other.

boto3's errors are sorted into three kinds a caller acts on differently:
``ArchiveUnavailable`` (no answer, a timeout, a 5xx: try again, backing off),
``ArchiveDenied`` (credentials or permissions: a condition for a human, retried
slowly, never in a storm) and ``ArchiveMissing`` (no such object). Credentials
and the region are found the way every AWS SDK finds them (the environment, a
shared credentials file); they never reach a log line or an error message.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import botocore.exceptions

from stream_format.archive import ArchiveLocation
from stream_server.declared.groups import ArchiveSettings

DELETE_BATCH = 1000  # keys per DeleteObjects request, the S3 limit

_DENIED = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "AllAccessDisabled",
    "AccountProblem",
    "NoSuchBucket",
    "InvalidBucketName",
}
_MISSING = {"NoSuchKey", "404", "NotFound"}


class ArchiveError(Exception):
    """Anything the object store refused or failed to do; the message says what, and
    names the object, never a credential."""


class ArchiveUnavailable(ArchiveError):
    """No answer, a timeout or a server error: worth retrying, with a back-off."""


class ArchiveDenied(ArchiveError):
    """Credentials, permissions or the bucket are wrong: a person must act."""


class ArchiveMissing(ArchiveError):
    """No object of that name."""


class ObjectStore:
    """One archive location's objects. Thread-safe (boto3 clients are)."""

    def __init__(
        self, settings: ArchiveSettings, *, connect_timeout: float = 5.0, read_timeout: float = 30.0
    ) -> None:
        """The store the ``--archive-*`` settings name; the credentials are boto3's to find.

        boto3 is imported here, not with the module: every server imports this module
        (the archive's Parts name its types), and boto3 with botocore's session and
        config are 0.17 to 0.23 s of a server's 1.4 s of imports (``python -X
        importtime``, docs/performance.md), which a server without an archive need not
        pay."""
        import boto3
        import botocore.config

        self.location = ArchiveLocation.parse(settings.archive_url)
        session = boto3.session.Session()
        self._client: Any = session.client(
            "s3",
            endpoint_url=settings.archive_endpoint or None,
            region_name=settings.archive_region or session.region_name or "us-east-1",
            verify=settings.archive_ca_bundle or None,
            config=botocore.config.Config(
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                # Retries are the caller's (it backs off and counts them); one quick
                # retry here covers a dropped keep-alive connection.
                retries={"max_attempts": 2, "mode": "standard"},
                s3={"addressing_style": "path"},
                # Checksums only when an operation requires one: several S3-compatible
                # stores refuse the newer default trailers.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    @property
    def url(self) -> str:
        return self.location.url

    def _key(self, name: str) -> str:
        return self.location.key(name)

    def put_new(self, name: str, body: bytes) -> bool:
        """Write ``name`` unless it exists: True when written, False when an object of
        that name was there first (412: it is never replaced)."""
        try:
            self._client.put_object(
                Bucket=self.location.bucket, Key=self._key(name), Body=body, IfNoneMatch="*"
            )
        except botocore.exceptions.ClientError as exc:
            if _status(exc) == 412 or _code(exc) == "PreconditionFailed":
                return False
            raise _sorted(exc, f"writing {name}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise _unavailable(exc, f"writing {name}") from None
        return True

    def get(self, name: str) -> bytes:
        return self._get(name, None)

    def get_range(self, name: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``name`` from ``start`` (fewer at its end)."""
        return self._get(name, f"bytes={start}-{start + length - 1}")

    def _get(self, name: str, byte_range: str | None) -> bytes:
        extra = {"Range": byte_range} if byte_range else {}
        try:
            answer = self._client.get_object(
                Bucket=self.location.bucket, Key=self._key(name), **extra
            )
            data: bytes = answer["Body"].read()
        except botocore.exceptions.ClientError as exc:
            raise _sorted(exc, f"reading {name}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise _unavailable(exc, f"reading {name}") from None
        return data

    def size(self, name: str) -> int:
        try:
            answer = self._client.head_object(Bucket=self.location.bucket, Key=self._key(name))
        except botocore.exceptions.ClientError as exc:
            raise _sorted(exc, f"reading {name}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise _unavailable(exc, f"reading {name}") from None
        return int(answer["ContentLength"])

    def objects(self, prefix: str, start_after: str = "") -> Iterator[tuple[str, int]]:
        """(name, size) of every object whose name starts with ``prefix``, in name order,
        after ``start_after`` (a name) when given."""
        paginator = self._client.get_paginator("list_objects_v2")
        args: dict[str, Any] = {"Bucket": self.location.bucket, "Prefix": self._key(prefix)}
        if start_after:
            args["StartAfter"] = self._key(start_after)
        cut = len(self.location.prefix)
        try:
            for page in paginator.paginate(**args):
                for item in page.get("Contents", ()):
                    yield item["Key"][cut:], int(item["Size"])
        except botocore.exceptions.ClientError as exc:
            raise _sorted(exc, f"listing {prefix or 'the archive'}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise _unavailable(exc, f"listing {prefix or 'the archive'}") from None

    def delete(self, names: list[str]) -> None:
        """Delete ``names`` (those already gone are no error)."""
        for i in range(0, len(names), DELETE_BATCH):
            chunk = names[i : i + DELETE_BATCH]
            objects = [{"Key": self._key(n)} for n in chunk]
            try:
                answer = self._client.delete_objects(
                    Bucket=self.location.bucket, Delete={"Objects": objects, "Quiet": True}
                )
            except botocore.exceptions.ClientError as exc:
                raise _sorted(exc, f"deleting {len(chunk)} objects") from None
            except botocore.exceptions.BotoCoreError as exc:
                raise _unavailable(exc, f"deleting {len(chunk)} objects") from None
            failed = [e for e in answer.get("Errors", ()) if e.get("Code") not in _MISSING]
            if failed:
                first = failed[0]
                raise ArchiveUnavailable(
                    f"deleting {first.get('Key')}: {first.get('Code')} {first.get('Message', '')}"
                )


def _status(exc: botocore.exceptions.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _sorted(exc: botocore.exceptions.ClientError, doing: str) -> ArchiveError:
    code, status = _code(exc), _status(exc)
    message = f"{doing}: {code or status} {exc.response.get('Error', {}).get('Message', '')}"
    if code in _MISSING or status == 404:
        return ArchiveMissing(message.strip())
    if code in _DENIED or status in (401, 403):
        return ArchiveDenied(message.strip())
    return ArchiveUnavailable(message.strip())


def _unavailable(exc: botocore.exceptions.BotoCoreError, doing: str) -> ArchiveError:
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return ArchiveDenied(f"{doing}: no credentials (AWS_ACCESS_KEY_ID, a credentials file)")
    return ArchiveUnavailable(f"{doing}: {type(exc).__name__}: {exc}")
