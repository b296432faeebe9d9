"""How Prometheus finds every server of a DurableStream: a Prometheus Operator PodMonitor.

Every pod is scraped, the primary and each standby, as CloudNativePG does: a
ServiceMonitor on the client Service reached the primary only (the Service selects
it), so a standby's disk-full, storage-failed and recovery alerts never fired, and
nothing was scraped while a failover was under way.

``spec.metrics.podMonitor`` (enabled, interval, labels, tlsConfig) asks for it.

The series keep ``job="durable-streams"`` (``jobLabel`` names the pods'
``app.kubernetes.io/name`` label), which the dashboard and the alerts select on, and
each carries ``namespace``, ``pod`` and ``instance`` (the pod's address) as the
Prometheus Operator labels a pod's target.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from stream_operator.api.spec import MonitorSpec, SpecInput, with_defaults

DEFAULT_INTERVAL = "30s"
JOB_LABEL = "app.kubernetes.io/name"  # its value on every server pod: durable-streams


def podmonitor_settings(spec: SpecInput) -> MonitorSpec:
    """``metrics.podMonitor``, its interval ``DEFAULT_INTERVAL`` when left out."""
    pod = with_defaults(spec).metrics.pod_monitor
    return replace(pod, interval=pod.interval or DEFAULT_INTERVAL)


def podmonitor_tls(name: str, namespace: str, spec: SpecInput) -> dict[str, Any]:
    """How Prometheus checks a pod's certificate: never skipped unless asked for.

    Pods are scraped by IP address, which no certificate names: the name checked
    (``serverName``) is one every pod's certificate carries, by default the client
    Service's ``<name>.<namespace>.svc`` (the Certificate the operator makes with
    ``certificates.issuerRef`` has it; so must a certificate made otherwise). The CA is
    ``tlsConfig.ca``, by default the ``ca.crt`` cert-manager writes into the TLS Secret.
    """
    s = with_defaults(spec)
    wanted = podmonitor_settings(s).tls_config
    if wanted.get("insecureSkipVerify"):
        return {"insecureSkipVerify": True}
    ca = wanted.get("ca") or {"secret": {"name": s.server.tls_secret_name, "key": "ca.crt"}}
    return {"ca": ca, "serverName": wanted.get("serverName") or f"{name}.{namespace}.svc"}


def render_podmonitor(
    name: str,
    namespace: str,
    meta: dict[str, Any],
    spec: SpecInput,
    pod_selector: Mapping[str, str],
    extra_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The PodMonitor over the pods ``pod_selector`` selects (the StatefulSet's).

    ``meta`` is the owned object's metadata as render.py makes it; its labels come after
    ``extra_labels`` (the operator's setting) and the spec's: a Prometheus that selects
    monitors by label (kube-prometheus-stack: ``release``) finds it, and the labels the
    operator prunes by cannot be overridden.
    """
    s = with_defaults(spec)
    wanted = podmonitor_settings(s)
    tls = bool(s.server.tls_secret_name)
    endpoint: dict[str, Any] = {
        "port": "http",  # the container port's name: each pod once, on its server port
        "path": "/metrics",
        "interval": wanted.interval,
        "scheme": "https" if tls else "http",
    }
    if tls:
        endpoint["tlsConfig"] = podmonitor_tls(name, namespace, s)
    meta = {**meta, "labels": {**(extra_labels or {}), **wanted.labels, **meta["labels"]}}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            # job="durable-streams" for every instance: what the alerts match on.
            "jobLabel": JOB_LABEL,
            "selector": {"matchLabels": dict(pod_selector)},
            "podMetricsEndpoints": [endpoint],
        },
    }
