"""The two stacks the export must carry (the lab's cpu-lab rigs and the story's worked example), as host data, and
the checks every exported object goes through: the targets' schemas kept as fixtures (tests/fixtures/export)."""

from __future__ import annotations

import copy
import json
import runpy
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft7Validator, Draft202012Validator

from rigkit.lab.rigs import LAB_MODEL_STORE

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "export"
KUBERNETES = FIXTURES / "kubernetes-v1.30.0"
CHART = FIXTURES / "production-stack-0.1.12"
KUBERNETES_SCHEMAS = {
    "Deployment": "deployment-apps-v1.json",
    "Service": "service-v1.json",
    "PersistentVolumeClaim": "persistentvolumeclaim-v1.json",
}
# keys the chart's templates read that its values.schema.json does not declare (each checked in
# helm/templates/deployment-vllm-multi.yaml; tests/fixtures/export/README.md)
READ_BUT_UNDECLARED = {("servingEngineSpec", "modelSpec", "lmcacheConfig", "diskOffloadingBufferSize")}

LAB_IMAGE = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64
LAB_MODEL = "controller:/var/cache/rigkit/lab-model/tiny@" + "ab" * 32
QWEN_PIN = "Qwen/Qwen3.6-27B-FP8@" + "c" * 40


def lab_hosts(rigs: int = 2) -> dict[str, dict]:
    """What inventory/lab.py and group_data/lab.py give each lab rig (without a lab: digests made up)."""
    return {
        f"rig{index}": {
            "serving_profile": "cpu-lab",
            "serving_image": LAB_IMAGE,
            "model_source": LAB_MODEL,
            "model_store_path": LAB_MODEL_STORE,
            "gpus": 0,
            "num_gpu_blocks_override": 72,
            "serving_port": 8100 + index,
            "l2_device": f"/dev/disk/by-id/nvme-rigkit-lab-rig{index}",
        }
        for index in range(1, rigs + 1)
    }


def worked_example_hosts(pinned: bool = True) -> dict[str, dict]:
    """group_data/dual_3090_qwen36.py's rig; ``pinned``: its model by revision (model_source) instead of by name."""
    data = {
        key: value
        for key, value in runpy.run_path(str(ROOT / "group_data" / "dual_3090_qwen36.py")).items()
        if not key.startswith("_")
    }
    if pinned:
        del data["model"]
        data["model_source"] = QWEN_PIN
    return {"rig-qwen36": {**data, "l2_device": "/dev/disk/by-id/nvme-x-part2"}}


def kubernetes_errors(objects: list[dict[str, Any]]) -> list[str]:
    """Every schema error of each object, against Kubernetes v1.30.0's strict schema of its kind."""
    errors = []
    for item in objects:
        schema = json.loads((KUBERNETES / KUBERNETES_SCHEMAS[item["kind"]]).read_text())
        validator = Draft7Validator(schema)
        errors += [f"{item['kind']} {list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(item)]
    return errors


def _merged(base: Any, overlay: Any) -> Any:
    """Helm's merge of a values file over the chart's values.yaml: maps merged key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = dict(base)
        for key, value in overlay.items():
            merged[key] = _merged(base.get(key), value) if key in base else value
        return merged
    return copy.deepcopy(overlay)


def _undeclared(values: Any, schema: dict, path: tuple = ()) -> list[tuple]:
    """Key paths (list indices left out) of ``values`` the schema does not declare, where it declares properties."""
    found = []
    if isinstance(values, dict) and "properties" in schema:
        for key, value in values.items():
            if key not in schema["properties"]:
                found.append((*path, key))
            else:
                found += _undeclared(value, schema["properties"][key], (*path, key))
    elif isinstance(values, list) and isinstance(schema.get("items"), dict):
        for value in values:
            found += _undeclared(value, schema["items"], path)
    return found


def chart_errors(values: dict[str, Any]) -> list[str]:
    """Schema errors of ``values`` merged over the chart's own values.yaml, and every key the schema does not
    declare (the schema allows any: a misspelt key would pass) that the templates do not read either."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    merged = _merged(yaml.safe_load((CHART / "values.yaml").read_text()), values)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in Draft202012Validator(schema).iter_errors(merged)]
    errors += [f"undeclared {path}" for path in _undeclared(values, schema) if path not in READ_BUT_UNDECLARED]
    return sorted(set(errors))
