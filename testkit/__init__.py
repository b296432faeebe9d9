"""Test-only parts that stand in for what cannot run here: a Kubernetes API server, a kubelet."""
