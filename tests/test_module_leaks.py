"""The guard against a product function left replaced by a test (``testkit.module_leaks``):
it names a function replaced since its snapshot, and none that was put back."""

from __future__ import annotations

import pytest

from stream_operator.kube import events
from testkit.module_leaks import functions, replaced


def test_a_replaced_function_is_named_and_one_put_back_is_not(monkeypatch: pytest.MonkeyPatch):
    before = functions()
    assert ("stream_operator.kube.events", "post") in before
    assert replaced(before) == []
    with monkeypatch.context() as m:
        m.setattr(events, "post", lambda *_, **__: None)
        assert replaced(before) == ["stream_operator.kube.events.post"]
    assert replaced(before) == []
