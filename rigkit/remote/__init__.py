"""Reaching a rig and the servers rigkit talks to: the SSH tunnel, HTTP sessions, the image registry, the
OpenAI-compatible measuring client."""
