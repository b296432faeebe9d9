"""Which replica sets serve TLS from the built-in CA, and which keep plain HTTP (pure)."""

from __future__ import annotations

from typing import Any

from stream_operator.api.spec import PLAIN_HTTP, spec_of, with_defaults
from stream_operator.specs.certificates import plain_http_kept, serves_tls


def ds(spec: dict[str, Any], **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "ev", "annotations": annotations}, "spec": spec}


def sts(*volumes: str) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"volumes": [{"name": v} for v in volumes]}}}}


def test_a_new_replica_set_serves_tls_and_a_single_server_or_an_opt_out_does_not():
    assert serves_tls(ds({"replicas": 3}))
    assert not serves_tls(ds({"replicas": 1}))
    assert not serves_tls(ds({"replicas": 3, "certificates": {"builtIn": False}}))


def test_a_running_plain_set_is_kept_plain_unless_the_spec_chooses():
    three = with_defaults({"replicas": 3})
    assert plain_http_kept("ev", three, sts("data"))  # an older operator's set
    assert not plain_http_kept("ev", three, None)  # a new set
    assert not plain_http_kept("ev", three, sts("data", "tls"))  # serving TLS already
    chosen = with_defaults({"replicas": 3, "certificates": {"builtIn": True}})
    assert not plain_http_kept("ev", chosen, sts("data"))
    assert not plain_http_kept("ev", with_defaults({"replicas": 1}), sts("data"))


def test_the_mark_means_builtin_false_until_the_spec_says_otherwise():
    marked = ds({"replicas": 3}, **{PLAIN_HTTP: "true"})
    assert spec_of(marked).certificates.built_in is False and not serves_tls(marked)
    chosen = ds({"replicas": 3, "certificates": {"builtIn": True}}, **{PLAIN_HTTP: "true"})
    assert spec_of(chosen).certificates.built_in is True and serves_tls(chosen)
