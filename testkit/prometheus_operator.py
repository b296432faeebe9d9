"""A PodMonitor as the Prometheus Operator turns it into a Prometheus scrape job.

Follows ``generatePodMonitorConfig`` of prometheus-operator v0.93.0
(``pkg/prometheus/promcfg.go``; the expected output in its
``pkg/prometheus/testdata/PodMonitorObjectWithMatchLabelSelector.golden``) for what a
DurableStream's PodMonitor uses: the job name, the pod role in the monitor's namespace,
interval, path, scheme, TLS (the CA copied from its Secret into a file, the server name,
insecureSkipVerify), and the relabelling: the running-pod filter, one ``keep`` per
selector label, the port name, the namespace/container/pod labels, the job (the monitor's
name, then the ``jobLabel`` pod label), the endpoint, and sharding with one shard.

The one change: discovery is ``http_sd_configs`` at ``discovery_url`` (testkit
.pod_discovery, which answers what the pod role would), as Debian's Prometheus has no
Kubernetes discovery.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from testkit.cluster import Cluster
from testkit.pod_discovery import sanitize


def _secret_file(cluster: Cluster, namespace: str, ref: dict[str, str], into: Path) -> str:
    """A Secret's key as a file, as the operator mounts it into the Prometheus pod."""
    secret = cluster.get("Secret", namespace, ref["name"]) or {}
    raw = (secret.get("data") or {})[ref["key"]]
    into.mkdir(parents=True, exist_ok=True)
    path = into / f"secret_{namespace}_{ref['name']}_{ref['key']}"
    path.write_bytes(base64.b64decode(raw))
    return str(path)


def scrape_configs(  # noqa: C901 - the Prometheus operator's generation, field by field
    cluster: Cluster, monitor: dict[str, Any], discovery_url: str, files: Path
) -> list[dict[str, Any]]:
    """One scrape config per ``podMetricsEndpoints`` entry."""
    namespace, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    spec = monitor["spec"]
    out = []
    for i, ep in enumerate(spec["podMetricsEndpoints"]):
        cfg: dict[str, Any] = {
            "job_name": f"podMonitor/{namespace}/{name}/{i}",
            "honor_labels": False,
            # kubernetes_sd_configs: [{role: pod, namespaces: {names: [namespace]}}]
            "http_sd_configs": [{"url": discovery_url, "refresh_interval": "1s"}],
        }
        if ep.get("interval"):
            cfg["scrape_interval"] = ep["interval"]
        if ep.get("path"):
            cfg["metrics_path"] = ep["path"]
        if ep.get("scheme"):
            cfg["scheme"] = ep["scheme"]
        tls = ep.get("tlsConfig")
        if tls:
            tls_config: dict[str, Any] = {}
            if (tls.get("ca") or {}).get("secret"):
                tls_config["ca_file"] = _secret_file(cluster, namespace, tls["ca"]["secret"], files)
            if tls.get("serverName"):
                tls_config["server_name"] = tls["serverName"]
            if tls.get("insecureSkipVerify"):
                tls_config["insecure_skip_verify"] = True
            cfg["tls_config"] = tls_config
        relabel: list[dict[str, Any]] = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
        ]
        for key, value in sorted(spec["selector"].get("matchLabels", {}).items()):
            relabel.append(
                {
                    "action": "keep",
                    "source_labels": [
                        f"__meta_kubernetes_pod_label_{sanitize(key)}",
                        f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}",
                    ],
                    "regex": f"({value});true",
                }
            )
        if ep.get("port"):
            relabel.append(
                {
                    "action": "keep",
                    "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": ep["port"],
                }
            )
        relabel += [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {
                "source_labels": ["__meta_kubernetes_pod_container_name"],
                "target_label": "container",
            },
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{namespace}/{name}"},
        ]
        if spec.get("jobLabel"):
            relabel.append(
                {
                    "source_labels": [f"__meta_kubernetes_pod_label_{sanitize(spec['jobLabel'])}"],
                    "target_label": "job",
                    "regex": "(.+)",
                    "replacement": "${1}",
                }
            )
        if ep.get("port"):
            relabel.append({"target_label": "endpoint", "replacement": ep["port"]})
        relabel += [  # sharding, one shard ($(SHARD) is 0)
            {
                "source_labels": ["__address__", "__tmp_hash"],
                "target_label": "__tmp_hash",
                "regex": "(.+);",
                "replacement": "$1",
                "action": "replace",
            },
            {
                "source_labels": ["__tmp_hash"],
                "target_label": "__tmp_hash",
                "modulus": 1,
                "action": "hashmod",
            },
            {
                "source_labels": ["__tmp_hash", "__tmp_disable_sharding"],
                "regex": "0;|.+;.+",
                "action": "keep",
            },
        ]
        cfg["relabel_configs"] = relabel
        out.append(cfg)
    return out
