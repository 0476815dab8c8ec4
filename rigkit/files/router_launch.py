#!/usr/bin/env python3
"""Runs ON the gateway, in the router's venv: start vllm-router with its workers' API key read from a file.

Usage: router_launch.py [--api-key-file FILE] VLLM_ROUTER_ARGS...
vllm-router takes the key only as ``--api-key`` (no environment variable); given on the unit's command line it
would show in ``ps`` and ``systemctl show``. Here it is added to the arguments inside this process.
"""

import sys

from vllm_router.launch_router import launch_router, parse_router_args

KEY_FILE_FLAG = "--api-key-file"


def router_argv(argv: list[str]) -> list[str]:
    if argv[:1] != [KEY_FILE_FLAG]:
        return argv
    with open(argv[1]) as key_file:
        key = key_file.read().strip()
    return [*argv[2:], "--api-key", key]


if __name__ == "__main__":
    launch_router(parse_router_args(router_argv(sys.argv[1:])))
