"""The engine gates: Docker engine and compose, the pinned image, the stack's ports."""

from __future__ import annotations

from rigkit.preflight.findings import Finding, HostFacts
from rigkit.remote.registry import registry_failure
from rigkit.settings.hostdata import Settings


def check_engine(facts: HostFacts) -> list[Finding]:
    if not facts.has_engine:
        return [
            Finding(
                "refuse", "engine", "docker", None, "no Docker engine answers on the rig", "run the docker role first"
            )
        ]
    if facts.compose_command is None:
        return [
            Finding(
                "refuse",
                "engine",
                "compose",
                None,
                "neither `docker compose` nor `docker-compose`",
                "install the compose plugin (the docker role does)",
            )
        ]
    return [Finding("ok", "engine", "compose", facts.compose_command, f"docker and {facts.compose_command} present")]


def check_image(settings: Settings, facts: HostFacts) -> list[Finding]:
    if facts.image_present:
        return [Finding("ok", "image", "serving_image", settings.image, "image already on the rig")]
    if facts.image_probe_error:  # unreachable, hung, digest not served, auth...: each has its own words and fix
        failure = registry_failure(facts.image_probe_error, settings.image)
        return [
            Finding(
                "refuse",
                "image",
                "serving_image",
                settings.image,
                f"{failure.problem}; the image is not on the rig (docker: {facts.image_probe_error})",
                failure.fix,
            )
        ]
    if facts.registry_reachable is False:
        return [
            Finding(
                "refuse",
                "image",
                "serving_image",
                settings.image,
                "image not on the rig and its registry is unreachable",
                "bring the registry back or deploy a digest the rig keeps (rollback)",
            )
        ]
    return [Finding("ok", "image", "serving_image", settings.image, "image will be pulled by digest")]


def check_port(settings: Settings, facts: HostFacts) -> list[Finding]:
    """Every port the stack listens on must be free on the rig, or held by rigkit's own stack (which the
    release replaces)."""
    heard = {"serving_port": facts.port_listeners, **(facts.stack_port_listeners or {})}
    return [
        finding
        for knob, port in settings.listen_ports.items()
        if heard.get(knob) is not None
        for finding in _check_one_port(knob, port, heard[knob], facts.stack_container_ids)
    ]


def _check_one_port(knob: str, port: int, listeners: list[dict], stack_ids: tuple[str, ...]) -> list[Finding]:
    ours = [cid for cid in stack_ids if cid]
    foreign = [
        listener
        for listener in listeners
        if not any(full.startswith(cid) for full in listener.get("containers", []) for cid in ours)
    ]
    if not foreign:
        return [Finding("ok", "port", knob, port, f"port {port} free or held by rigkit's stack")]
    who = ", ".join(
        f"pid {who['pid']} ({who.get('command')})" if who.get("pid") else "a process outside the rig's view"
        for who in foreign
    )
    return [
        Finding(
            "refuse",
            "port",
            knob,
            port,
            f"TCP port {port} on the rig is already in use by {who}",
            f"stop what listens there (`ss -ltnp 'sport = :{port}'` on the rig) or set {knob} to a free port",
        )
    ]
