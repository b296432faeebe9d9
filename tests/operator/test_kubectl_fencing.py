"""Issue 25: how ``kubectl dstream fence|unfence`` edits the fenced list (pure rules, as
CloudNativePG's plugin applies them to cnpg.io/fencedInstances)."""

from __future__ import annotations

import pytest

from stream_operator.plugin import PluginError, fencing


def test_the_fenced_list_follows_cloudnativepgs_rules():
    assert fencing.fence([], ["events-1"], all_pods=False) == ["events-1"]
    assert fencing.fence(["*"], ["events-1"], all_pods=False) == ["*"]
    assert fencing.unfence(["events-1", "events-2"], ["events-2"], all_pods=False) == ["events-1"]
    assert fencing.unfence(["*"], [], all_pods=True) == []
    with pytest.raises(PluginError):
        fencing.unfence(["*"], ["events-1"], all_pods=False)
    with pytest.raises(PluginError):
        fencing.fenced_list('{"events-1": true}')
