"""rigkit export: the lab's profile and the story's worked example to both targets, each object valid against the
target's schema (fixtures), the engine command held flag by flag against the rig's, and every gap refused by name."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from engine_argv import LMCACHE_SHIM, SHIM, flags, run_entrypoint
from export_cases import ROOT, chart_errors, kubernetes_errors, lab_hosts, worked_example_hosts

from rigkit.cli import main
from rigkit.errors import ConfigError
from rigkit.export import kubernetes, production_stack
from rigkit.export.engine import launch_argv
from rigkit.export.gaps import refuse_gaps
from rigkit.export.group import group_stack

# what each case must accept to export, by target: the gaps its settings have there (and no more)
CASES = {
    "lab": (lambda: group_stack("lab", lab_hosts()), {"kubernetes": ["l2_budget_gb"]}),
    "worked-example": (
        lambda: group_stack("dual_3090_qwen36", worked_example_hosts()),
        {"kubernetes": ["restart_policy"]},
    ),
}
PRODUCTION_STACK_ACCEPTS = {
    "lab": ["l2_budget_gb", "serving_profile"],
    "worked-example": ["restart_policy", "serving_profile"],
}


@pytest.mark.parametrize("case", CASES)
def test_kubernetes_objects_are_valid_for_kubernetes_1_30(case):
    group = CASES[case][0]()
    refuse_gaps(kubernetes.gaps(group), CASES[case][1]["kubernetes"])
    objects = kubernetes.manifest(group)
    assert kubernetes_errors(objects) == []
    kinds = [item["kind"] for item in objects]
    assert kinds.count("Deployment") == len(group.stacks) and kinds[-1] == "Service"


@pytest.mark.parametrize("case", CASES)
def test_production_stack_values_are_valid_for_the_chart(case):
    group = CASES[case][0]()
    if case == "lab":  # the chart has one containerPort; the lab's rigs each have their own (host networking)
        group = group_stack("lab", {name: {**data, "serving_port": 8000} for name, data in lab_hosts().items()})
    refuse_gaps(production_stack.gaps(group), PRODUCTION_STACK_ACCEPTS[case])
    assert chart_errors(production_stack.values(group)) == []


def test_the_image_comes_out_by_digest_from_the_charts_repository_and_tag():
    # deployment-vllm-multi.yaml: image: "{{ repository }}:{{ tag }}"
    image = "lmcache/vllm-openai@sha256:" + "0" * 64
    fields = production_stack.image_fields(image)
    assert f"{fields['repository']}:{fields['tag']}" == image


def test_the_pinned_model_is_a_read_only_revision_with_the_hub_off():
    ((rig, stack),) = group_stack("g", worked_example_hosts()).stacks.items()
    deployment = kubernetes.deployment("g", rig, stack)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "model")
    assert mount == {
        "name": "model",
        "mountPath": "/model",
        "readOnly": True,
        "subPath": "Qwen--Qwen3.6-27B-FP8/" + "c" * 40,
    }
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["RIGKIT_MODEL"] == "/model"
    assert container["image"] == stack.image and "@sha256:" in container["image"]


def test_the_hash_seed_of_a_shared_tier_reaches_both_targets_after_the_charts_own():
    hosts = lab_hosts()
    for data in hosts.values():
        data.update(kv_share=True, kv_share_source="nas:/export/kv", kv_share_mount_point="/mnt/kv", kv_hash_seed=7)
    hosts["rig1"]["kv_share_janitor"] = True
    group = group_stack("lab", hosts)
    pod = kubernetes.deployment("lab", "rig1", group.stacks["rig1"])["spec"]["template"]["spec"]
    assert {"name": "PYTHONHASHSEED", "value": "7"} in pod["containers"][0]["env"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert "rigkit-lab-kv-share" in claims  # one ReadWriteMany claim for the shared store
    spec, _ = production_stack.model_spec("rig1", group.stacks["rig1"], "lab")
    assert {"name": "PYTHONHASHSEED", "value": "7"} in spec["env"]  # after the chart's "123": the container's


# --- the engine command, flag by flag ---------------------------------------------------------------------


def stacks():
    return [
        *group_stack("lab", lab_hosts(1)).stacks.values(),
        *group_stack("w", worked_example_hosts()).stacks.values(),
    ]


@pytest.mark.parametrize("index", [0, 1])
def test_launch_argv_is_what_bash_launches_from_the_rigs_entrypoint(index, tmp_path):
    stack = stacks()[index]
    (argv,) = [a for name, a in run_entrypoint(tmp_path, stack).items() if name != "lmcache"]
    assert launch_argv(stack)[1:] == argv


def pod_argv(tmp_path: Path, deployment: dict) -> list[str]:
    """What the pod's container would launch: its command and env in bash, programs replaced by shims."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, shim in (("vllm", SHIM), ("lmcache", LMCACHE_SHIM), ("python", SHIM)):
        (bin_dir / name).write_text(shim)
        (bin_dir / name).chmod(0o755)
    env = {item["name"]: item.get("value", "") for item in container["env"]}
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", ARGV_LOG=str(tmp_path / "argv"), LMCACHE_HTTP_PORT="18080")
    script = container["args"][0].replace("/opt/vllm/bin/python", str(bin_dir / "python"))
    subprocess.run([*container["command"], script], env=env, check=True, timeout=30, capture_output=True)
    program = "python" if "/opt/vllm/bin/python" in container["args"][0] else "vllm"
    return json.loads((tmp_path / f"argv.{program}").read_text().splitlines()[0])


@pytest.mark.parametrize("index", [0, 1])
def test_the_pods_command_is_the_rigs_but_for_the_bind_address(index, tmp_path):
    stack = stacks()[index]
    (tmp_path / "rig").mkdir()
    (tmp_path / "pod").mkdir()
    (rig,) = [argv for name, argv in run_entrypoint(tmp_path / "rig", stack).items() if name != "lmcache"]
    pod = pod_argv(tmp_path / "pod", kubernetes.deployment("g", "r", stack))
    at = rig.index("--host") + 1
    assert pod[at] == "0.0.0.0"
    assert pod[:at] + pod[at + 1 :] == rig[:at] + rig[at + 1 :]  # word for word, in order


def chart_argv(spec: dict, port: int) -> list[str]:
    """The engine argv helm/templates/deployment-vllm-multi.yaml (chart 0.1.12) renders for the fields the export
    writes: `vllm serve MODEL --host 0.0.0.0 --port PORT`, the vllmConfig flags in the template's order, extraArgs,
    then lmcacheConfig's --kv-transfer-config."""
    config = spec["vllmConfig"]
    argv = ["vllm", "serve", spec["modelURL"], "--host", "0.0.0.0", "--port", str(port)]
    argv.append("--enable-prefix-caching" if config.get("enablePrefixCaching") else "--no-enable-prefix-caching")
    for field, flag in (
        ("maxModelLen", "--max-model-len"),
        ("dtype", "--dtype"),
        ("tensorParallelSize", "--tensor-parallel-size"),
        ("maxNumSeqs", "--max-num-seqs"),
        ("gpuMemoryUtilization", "--gpu_memory_utilization"),
    ):
        if field in config:
            argv += [flag, str(config[field])]
    argv += config.get("extraArgs", [])
    if spec.get("lmcacheConfig", {}).get("enabled"):
        argv += ["--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}']
    return argv


def spelled(flag_map: dict) -> dict:
    """Flags as vLLM's parser reads them: underscores in a flag's name are dashes."""
    return {flag.replace("_", "-"): value for flag, value in flag_map.items()}


@pytest.mark.parametrize("index", [0, 1])
def test_the_charts_command_is_the_rigs_but_for_the_bind_address_and_an_accepted_connector(index):
    stack = stacks()[index]
    spec, port = production_stack.model_spec("r", stack, "g")
    chart = chart_argv(spec, port)
    rig = launch_argv(stack)
    model, rig_rest = production_stack.split_launch(rig)
    assert chart[2] == model
    chart_flags, rig_flags = spelled(flags(chart[3:])), spelled(flags(rig_rest))
    assert chart_flags.pop("--host") == "0.0.0.0"
    rig_flags.pop("--host")
    if production_stack.lmcache_in_process(stack):  # the accepted gap: the chart's in-process LMCache
        assert json.loads(chart_flags.pop("--kv-transfer-config"))["kv_connector"] == "LMCacheConnectorV1"
        assert json.loads(rig_flags.pop("--kv-transfer-config"))["kv_connector"] == "LMCacheMPConnector"
    assert chart_flags == rig_flags


# --- refusals: each setting a target lacks, by name ----------------------------------------------------------


@pytest.mark.parametrize(
    "target, change, setting",
    [
        ("kubernetes", {"gpu_mask": "0,1"}, "gpu_mask"),
        ("production-stack", {"gpu_mask": "0,1"}, "gpu_mask"),
        ("kubernetes", {"restart_policy": "no"}, "restart_policy"),
        ("production-stack", {}, "serving_profile"),
        ("kubernetes", {}, "l2_budget_gb"),
    ],
)
def test_each_setting_a_target_lacks_is_refused_by_name(target, change, setting):
    hosts = {name: {**data, **change} for name, data in lab_hosts(1).items()}
    group = group_stack("lab", hosts)
    module = kubernetes if target == "kubernetes" else production_stack
    accepted = {gap.setting for gap in module.gaps(group)} - {setting}
    with pytest.raises(ConfigError) as refused:
        refuse_gaps(module.gaps(group), accepted)
    assert refused.value.field == setting and refused.value.fix


def test_a_router_policy_the_chart_lacks_is_refused_and_cannot_be_accepted():
    hosts = {name: {**data, "router_policy": "power_of_two"} for name, data in lab_hosts(1).items()}
    gaps = production_stack.gaps(group_stack("lab", hosts))
    with pytest.raises(ConfigError) as refused:
        refuse_gaps(gaps, {gap.setting for gap in gaps})
    assert refused.value.field == "router_policy" and "--accept" not in refused.value.fix


def test_an_unpinned_model_is_a_gap_and_an_accept_naming_no_gap_is_refused():
    group = group_stack("w", worked_example_hosts(pinned=False))
    with pytest.raises(ConfigError) as refused:
        refuse_gaps(kubernetes.gaps(group), ["restart_policy"])
    assert refused.value.field == "model_source"
    with pytest.raises(ConfigError) as unused:
        refuse_gaps(kubernetes.gaps(group), ["restart_policy", "model_source", "gpu_mask"])
    assert unused.value.field == "--accept" and unused.value.value == "gpu_mask"


def test_the_command_exports_the_worked_example_and_names_what_it_accepted(tmp_path, capsys):
    out = tmp_path / "k8s.yaml"
    inventory = str(ROOT / "inventory" / "dual_3090_qwen36.py")
    common = [inventory, "--group", "dual_3090_qwen36", "--target", "kubernetes"]
    assert main(["export", *common, "--accept", "restart_policy", "-o", str(out)]) == 2
    assert "model_source=None" in capsys.readouterr().err
    assert main(["export", *common, "--accept", "restart_policy", "--accept", "model_source", "-o", str(out)]) == 0
    text = out.read_text()
    assert "# accepted restart_policy='no'" in text and "# accepted model_source=None" in text
    assert kubernetes_errors(list(yaml.safe_load_all(text))) == []
