"""Validate each rig's cache tiers and write its results card.

    pyinfra inventory/X.py validate.py
    pyinfra inventory/X.py validate.py --data validate_prompt_tokens=37000
    pyinfra inventory/X.py validate.py --data replay=results/<run-id>   # same prompts/seeds as that run

Per rig: reach the serving API (SSH tunnel to the rig's loopback, or direct on a LAN bind), run
rigkit.validation's tier procedure (cold, warm-gpu, warm-connector, and warm-persistent after a
compose down/up on the rig), then write results/<run-id>/<rig>.card.json + Markdown + plots and
re-render the fleet card. The run id is shared by every host of one pyinfra run.
"""

from __future__ import annotations

import os
import shlex

from pyinfra import host
from pyinfra.operations import python

from rigkit.card import RESULTS_DIR, load_cards, new_run_id, render_run, write_card
from rigkit.client import ServingClient
from rigkit.errors import ConfigError
from rigkit.profiles import get_profile, load_profiles
from rigkit.tunnel import serving_url
from rigkit.validation import VARIABLES, Settings, to_card, validate_tiers

# One run id for every host of this pyinfra process (set once, inherited by the callbacks).
RUN_ID = os.environ.setdefault("RIGKIT_RUN_ID", new_run_id())
SSH_KEYS = ("ssh_hostname", "ssh_port", "ssh_user", "ssh_key", "ssh_key_password", "ssh_password",
            "ssh_known_hosts_file", "ssh_strict_host_key_checking", "ssh_allow_agent", "ssh_look_for_keys")


def _data(name: str, default=None):
    value = host.data.get(name)
    return default if value is None else value


def replayed_settings(replay_dir: str) -> dict:
    """Prompt sizes, kind, seed and session count of a recorded run, so rigs compare like with like."""
    card = load_cards(RESULTS_DIR.parent / replay_dir if not os.path.isabs(replay_dir) else replay_dir)[0]
    prompts = card.repro.prompts
    if not prompts:
        raise ConfigError("replay", replay_dir, "the recorded card lists no prompts", "replay a full validation run")
    return {"validate_prompt_tokens": prompts[0].target_tokens, "validate_prompt_kind": prompts[0].kind,
            "validate_seed": prompts[0].seed, "validate_sessions": len(prompts),
            "validate_output_tokens": card.repro.output_tokens or 16}


def _restart_stack(stack_dir: str, compose: str) -> None:
    """A full `down` then `up -d` (never `docker restart`: it races the release of GPU memory)."""
    command = f"cd {shlex.quote(stack_dir)} && {compose} down && {compose} up -d"
    status, output = host.run_shell_command(command)
    if not status:
        raise ConfigError("restart", command, f"compose down/up failed: {output.stderr[-300:]}",
                          "run the deploy again; check the rig's compose project")


def _has_connector() -> bool:
    name = _data("serving_profile")
    if not name:
        raise ConfigError("serving_profile", None, "no profile for this rig",
                          "validate rigs deployed by rigkit (their host data names the profile)")
    return get_profile(load_profiles(), name).connector is not None


def _validate() -> None:
    from roles.serving_facts import ComposeCommand

    data = {v.name: host.data.get(v.name) for v in VARIABLES if host.data.get(v.name) is not None}
    if host.data.get("replay"):
        data.update(replayed_settings(host.data.get("replay")))
    settings = Settings.from_data(data)
    stack_dir = _data("stack_dir")
    compose = host.get_fact(ComposeCommand)
    restart = (lambda: _restart_stack(stack_dir, compose)) if stack_dir and compose else None
    connection = {key: host.data.get(key) for key in SSH_KEYS if host.data.get(key) is not None}
    with serving_url(connection, _data("bind_address", "127.0.0.1"), int(_data("serving_port", 8000)),
                     inventory_name=host.name) as url:
        client = ServingClient(url, model=_data("served_model_name"))
        result = validate_tiers(client, restart, settings, connector_configured=_has_connector())
    card = to_card(host.name, RUN_ID, result, settings,
                   repro={"profile": _data("serving_profile"), "image_digest": _data("serving_image")})
    if restart is None:
        card.failures.append("persistent tier not measured: stack_dir or a compose command is missing on the rig")
    run_dir = RESULTS_DIR / RUN_ID
    write_card(run_dir, card)
    render_run(run_dir)
    print(f"{host.name}: {'PASS' if card.passed else 'FAIL'} -> {run_dir / (host.name + '.md')}")


python.call(name="Validate cache tiers and write the results card", function=_validate)
