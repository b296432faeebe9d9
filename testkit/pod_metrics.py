"""A server's /metrics as families, and what one worker process of ``--workers N`` exported.

``scrape`` reads and ``parse`` parses an exposition (failing on a family named twice, which a
Prometheus scrape refuses); ``sample`` reads one value of it. ``worker_samples``
reads the multiprocess files one worker writes (in the directory its environment
names), to tell which worker served what: a test spreads its traffic over
several connections, and the kernel decides which worker accepts each.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["parse", "sample", "scrape", "worker_samples"]

METRICS_ENV = b"PROMETHEUS_MULTIPROC_DIR="


def scrape(url: str) -> dict[str, Metric]:
    """The families of ``url``/metrics by name; no name twice."""
    return parse(httpx.get(f"{url}/metrics", timeout=10).text)


def parse(text: str) -> dict[str, Metric]:
    """The families of an exposition by name; no name twice."""
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"families exposed twice: {twice}"
    return {f.name: f for f in families}


def sample(families: dict[str, Metric], name: str, **labels: str) -> float:
    """The value of sample ``name`` with exactly ``labels`` (0 when absent)."""
    for family in families.values():
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


def worker_samples(pid: int, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """What worker ``pid`` wrote for sample ``name``, by labels (its own files only)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    directory = next(v[len(METRICS_ENV) :] for v in environ if v.startswith(METRICS_ENV))
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for path in Path(os.fsdecode(directory)).glob(f"*_{pid}.db"):
        for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path)):
            _, sample_name, labels, _ = json.loads(key)
            if sample_name == name:
                out[tuple(sorted(labels.items()))] = value
    return out
