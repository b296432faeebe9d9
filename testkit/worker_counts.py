"""The server as one process and as a writer behind two workers (``--workers``): the two
shapes a test that must hold for both runs in, under the same ids everywhere."""

from __future__ import annotations

import pytest

WORKER_COUNTS = pytest.mark.parametrize("workers", ["1", "2"], ids=["single", "2-workers"])
