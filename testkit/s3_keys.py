"""What every S3-compatible store the tests start shares: one identity's keys, the
environment a server reaching it runs with, a boto3 client for the test's own
checks, and a new bucket per test (``testkit.seaweedfs``, ``testkit.ceph_rgw``)."""

from __future__ import annotations

import itertools
import os
from typing import Any

REGION = "us-east-1"
_buckets = itertools.count(1)


class S3Keys:
    """Mixed into a store's class, which sets the keys and has an ``endpoint``."""

    access_key: str
    secret_key: str

    @property
    def endpoint(self) -> str:
        raise NotImplementedError

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a server or command reaching this store runs with."""
        return {
            **os.environ,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
            **extra,
        }

    def client(self) -> Any:
        """A boto3 S3 client for the test's own checks (the server has its own)."""
        import boto3
        import botocore.config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=REGION,
            config=botocore.config.Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 1},
                connect_timeout=2,
                read_timeout=10,
            ),
        )

    def new_bucket(self) -> str:
        """A new empty bucket, as ``s3://NAME``."""
        name = f"bucket-{os.getpid()}-{next(_buckets)}"
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"
