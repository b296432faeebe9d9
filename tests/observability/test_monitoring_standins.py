"""The stand-ins the PodMonitor test relies on, checked against what they stand in for.

* testkit.prometheus_operator against the Prometheus Operator's own expected output:
  ``pkg/prometheus/testdata/podMonitorObjectWithPodName.golden`` of
  prometheus-operator v0.93.0 (Apache-2.0), the scrape job for a PodMonitor
  ``default/defaultPodMonitor`` selecting ``group: group1`` on port ``podname``
  (``promcfg_test.go``). Only discovery differs (HTTP discovery here, as Debian's
  Prometheus has no Kubernetes discovery), and ``$(SHARD)`` is the one shard, 0.
* testkit.hosts (names of pods resolving to 127.0.0.1, as cluster DNS would resolve them).
* testkit.pod_discovery against Prometheus's pod role (``discovery/kubernetes/pod.go``):
  one target per container port at the pod's address, the pod's labels sanitized with
  their ``present`` twins, readiness from the Ready condition.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from testkit import hosts
from testkit.cluster import cluster
from testkit.hosts import HOSTS
from testkit.pod_discovery import pod_targets
from testkit.prometheus_operator import scrape_configs

GOLDEN_RELABEL = [
    {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
    {
        "action": "drop",
        "source_labels": ["__meta_kubernetes_pod_phase"],
        "regex": "(Failed|Succeeded)",
    },
    {
        "action": "keep",
        "source_labels": [
            "__meta_kubernetes_pod_label_group",
            "__meta_kubernetes_pod_labelpresent_group",
        ],
        "regex": "(group1);true",
    },
    {
        "action": "keep",
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": "podname",
    },
    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
    {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    {"target_label": "job", "replacement": "default/defaultPodMonitor"},
    {"target_label": "endpoint", "replacement": "podname"},
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
        "regex": "0;|.+;.+",  # $(SHARD);|.+;.+ with one shard
        "action": "keep",
    },
]


def test_a_podmonitor_becomes_the_prometheus_operators_scrape_job(tmp_path: Path):
    monitor = {
        "metadata": {"namespace": "default", "name": "defaultPodMonitor"},
        "spec": {
            "selector": {"matchLabels": {"group": "group1"}},
            "podMetricsEndpoints": [{"port": "podname", "interval": "30s"}],
        },
    }
    with cluster() as c:
        (job,) = scrape_configs(c, monitor, "http://sd", tmp_path)
    assert job["job_name"] == "podMonitor/default/defaultPodMonitor/0"
    assert job["honor_labels"] is False and job["scrape_interval"] == "30s"
    assert job["relabel_configs"] == GOLDEN_RELABEL
    # jobLabel: the pod label's value replaces the job, after the monitor's name.
    monitor["spec"]["jobLabel"] = "app.kubernetes.io/name"
    with cluster() as c:
        (job,) = scrape_configs(c, monitor, "http://sd", tmp_path)
    at = job["relabel_configs"].index(
        {"target_label": "job", "replacement": "default/defaultPodMonitor"}
    )
    assert job["relabel_configs"][at + 1] == {
        "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
        "target_label": "job",
        "regex": "(.+)",
        "replacement": "${1}",
    }


def test_pod_discovery_answers_as_the_pod_role():
    pod = {
        "metadata": {
            "name": "ds-1",
            "namespace": "obs",
            "uid": "u-1",
            "labels": {
                "app.kubernetes.io/name": "durable-streams",
                "streams.pyds.dev/role": "standby",
            },
            "ownerReferences": [{"kind": "StatefulSet", "name": "ds", "controller": True}],
        },
        "spec": {
            "containers": [
                {
                    "name": "server",
                    "image": "durable-streams-server:0.1.0",
                    "ports": [{"name": "http", "containerPort": 4437, "protocol": "TCP"}],
                }
            ]
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]},
    }
    (group,) = pod_targets(pod, "127.0.0.1:40001")
    assert group["targets"] == ["127.0.0.1:40001"]
    labels = group["labels"]
    assert labels["__meta_kubernetes_namespace"] == "obs"
    assert labels["__meta_kubernetes_pod_name"] == "ds-1"
    assert labels["__meta_kubernetes_pod_ip"] == "127.0.0.1"
    assert labels["__meta_kubernetes_pod_ready"] == "false"
    assert labels["__meta_kubernetes_pod_phase"] == "Running"
    assert labels["__meta_kubernetes_pod_label_app_kubernetes_io_name"] == "durable-streams"
    assert labels["__meta_kubernetes_pod_labelpresent_streams_pyds_dev_role"] == "true"
    assert labels["__meta_kubernetes_pod_controller_kind"] == "StatefulSet"
    assert labels["__meta_kubernetes_pod_container_port_name"] == "http"
    assert labels["__meta_kubernetes_pod_container_port_number"] == "4437"
    assert labels["__meta_kubernetes_pod_container_port_protocol"] == "TCP"
    assert labels["__meta_kubernetes_pod_container_init"] == "false"


def test_hosts_names_resolve_inside_the_block_only_and_others_stay():
    """testkit.hosts, cluster DNS's stand-in: two blocks at once keep each other's names."""
    first, second = "a-0.a-headless.t.svc", "b-0.b-headless.t.svc"
    before = HOSTS.read_text()
    with hosts.names([first]):
        with hosts.names([second]):
            assert socket.gethostbyname(first) == socket.gethostbyname(second) == "127.0.0.1"
        assert socket.gethostbyname(first) == "127.0.0.1"
        with pytest.raises(OSError):
            socket.gethostbyname(second)
    assert HOSTS.read_text() == before
