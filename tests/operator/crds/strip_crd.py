"""Turn a published CRD into the compact schema file the tests validate against.

    python tests/operator/crds/strip_crd.py CRD.yaml VERSION > tests/operator/crds/NAME.json

Keeps the served version's openAPIV3Schema without its descriptions (they are
most of the bytes and no part of validation).
"""

from __future__ import annotations

import json
import sys

import yaml


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main() -> None:
    path, version = sys.argv[1], sys.argv[2]
    with open(path) as fh:
        crd = yaml.safe_load(fh)
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    out = {
        "group": crd["spec"]["group"],
        "kind": crd["spec"]["names"]["kind"],
        "version": version,
        "openAPIV3Schema": strip(v["schema"]["openAPIV3Schema"]),
    }
    json.dump(out, sys.stdout, separators=(",", ":"), sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
