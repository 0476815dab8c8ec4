#!/usr/bin/env python3
"""Where the client TTFT's gap to vLLM's histogram comes from, on a lab rig (the lab up and deployed).

Every request is streamed by rigkit's probe on the rig's loopback (rigkit.remote.probe.RigProbe), so no tunnel is in the
client figure; each is one /metrics window, so the server figure is vLLM's own time_to_first_token for it. Three
prompts side by side, each cold then warm-gpu: ~4,900 tokens as text (what validation sends), the same size as
token ids (no tokenizing in the API server), and a ~33-token text (the engine's part small). Beside each gap, the
same request's API overhead (rigkit.remote.probe.API_OVERHEAD_MODEL: the body refused with 404 before any engine work)
and what is left of the gap once it is taken off (what the card compares with the tolerance).

    .venv/bin/python bench/ttft_gap.py [--rig rig1] [--reps 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rigkit.lab.state import read_state  # noqa: E402
from rigkit.prompts import PromptSpec, new_session_id  # noqa: E402
from rigkit.remote.client import ServingClient  # noqa: E402
from rigkit.remote.probe import RigProbe  # noqa: E402
from rigkit.remote.tunnel import open_tunnel  # noqa: E402
from rigkit.validation.measure import measure  # noqa: E402

LONG_TOKENS = 4900
TIERS = ("cold", "warm-gpu")


def prompt_bodies(client: ServingClient, rep: int) -> dict[str, object]:
    long_text = client.build_prompt(PromptSpec("narrative", LONG_TOKENS, 1000 + rep), new_session_id()).text
    other = client.build_prompt(PromptSpec("narrative", LONG_TOKENS, 2000 + rep), new_session_id()).text
    ids = client.session.post(
        f"{client.base_url}/tokenize", json={"model": client.model, "prompt": other}, timeout=30
    ).json()["tokens"]
    return {"text ~4,900": long_text, "ids ~4,900": ids, "text ~33": f"Session {new_session_id()}. Hello there."}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rig", default="rig1")
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--port", type=int, help="another vLLM on the rig's loopback (default: the rig's serving port)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=4,
        help="completion length: the lab's engine decodes the next token in the API process "
        "while it sends the first (1: nothing to decode after it)",
    )
    args = parser.parse_args()
    lab = read_state()
    rig = lab.rig(args.rig)
    gaps: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    port = args.port or rig.serving_port
    with open_tunnel(lab.ssh_data(rig), "127.0.0.1", port) as tunnel:
        client = ServingClient(tunnel.url, probe=RigProbe.on(rig.name, tunnel.run, "127.0.0.1", port))
        for rep in range(args.reps):
            for prompt, body in prompt_bodies(client, rep).items():
                for tier in TIERS:
                    measured = measure(client, body, max_tokens=args.max_tokens)
                    figures = (
                        measured.result.ttft_s * 1000,
                        measured.window.server_ttft_mean * 1000,
                        (measured.result.api_overhead_s or 0.0) * 1000,
                    )
                    gaps.setdefault((prompt, tier), []).append(figures)
                    print(
                        f"  {rep} {prompt:12} {tier:8} client {figures[0]:7.1f} ms  server {figures[1]:7.1f} ms"
                        f"  API overhead {figures[2]:5.1f} ms",
                        flush=True,
                    )
    print(
        f"\n{args.rig}:{port}, {args.reps} sessions each, {args.max_tokens} tokens each, medians "
        "(client - server = the gap; less the API overhead = left):"
    )
    print(
        f"{'prompt':12} {'tier':8} {'client ms':>10} {'server ms':>10} {'gap ms':>7} {'overhead':>9} "
        f"{'left ms':>8} {'left min-max':>13}"
    )
    for (prompt, tier), figures in gaps.items():
        gap = [client_ms - server_ms for client_ms, server_ms, _ in figures]
        left = [client_ms - server_ms - overhead_ms for client_ms, server_ms, overhead_ms in figures]
        print(
            f"{prompt:12} {tier:8} {statistics.median(f[0] for f in figures):10.1f} "
            f"{statistics.median(f[1] for f in figures):10.1f} {statistics.median(gap):7.1f} "
            f"{statistics.median(f[2] for f in figures):9.1f} {statistics.median(left):8.1f} "
            f"{min(left):6.1f}-{max(left):.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
