#!/usr/bin/env python3
"""Runs ON the gateway: wait for the router's /health, then print its /list_workers as JSON.

Usage: router_check.py BASE_URL TIMEOUT_S
Prints {"ready": bool, "waited_s": float, "urls": [...] or null, "error": str or null}; standard library only.
"""

import json
import sys
import time
import urllib.request


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


def main(base_url: str, timeout_s: float) -> dict:
    started = time.monotonic()
    error = None
    while True:
        try:
            get(f"{base_url}/health")
            break
        except OSError as exc:
            error = str(exc)
        if time.monotonic() - started > timeout_s:
            return {"ready": False, "waited_s": round(time.monotonic() - started, 1), "urls": None, "error": error}
        time.sleep(0.5)
    waited = round(time.monotonic() - started, 1)
    try:
        return {"ready": True, "waited_s": waited, "urls": json.loads(get(f"{base_url}/list_workers"))["urls"],
                "error": None}
    except (OSError, ValueError, KeyError) as exc:
        return {"ready": True, "waited_s": waited, "urls": None, "error": f"/list_workers: {exc}"}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], float(sys.argv[2]))))
