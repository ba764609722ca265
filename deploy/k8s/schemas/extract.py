"""Write the JSON schema of each version of a CustomResourceDefinition, for
tests/unit/test_deploy.py to validate our custom resources offline:

    python deploy/k8s/schemas/extract.py CRD.yaml [CRD.yaml ...]

writes deploy/k8s/schemas/<group>/<kind>_<version>.json: the CRD's
openAPIV3Schema as published by its project, with the descriptions removed
(they are most of the bytes, and no check reads them). README.md beside this
file names the CRDs and versions the committed files came from."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: without_descriptions(v)
            for k, v in node.items()
            # a property may be called "description": keep those
            if k != "description" or not isinstance(v, str)
        }
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def extract(crd_file: Path) -> list[Path]:
    written = []
    for crd in yaml.safe_load_all(crd_file.read_text()):
        if not crd or crd.get("kind") != "CustomResourceDefinition":
            continue
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = without_descriptions(version["schema"]["openAPIV3Schema"])
            out = HERE / spec["group"] / f"{spec['names']['kind']}_{version['name']}.json"
            out.parent.mkdir(exist_ok=True)
            out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
            written.append(out)
    return written


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        for path in extract(Path(arg)):
            print(path.relative_to(HERE))
