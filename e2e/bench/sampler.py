"""A thread that reads a server's state every few tenths of a second while a workload
runs (the replicated workload's standby lag, the archived workload's archive lag)."""

from __future__ import annotations

import threading

import httpx


class Sampler:
    """Calls ``sample`` with an HTTP client every ``every`` seconds between ``with``'s
    enter and exit; an HTTP error or a bad answer counts in ``failures``."""

    def __init__(self, every: float, name: str) -> None:
        self.every = every
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self, http: httpx.Client) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        with httpx.Client(timeout=5) as http:
            while not self._stop.wait(self.every):
                try:
                    self.sample(http)
                except (httpx.HTTPError, ValueError):
                    self.failures += 1
