"""The serving stack on a rig: compose and .env rendered from settings, the commands that release it, the release
decisions and their steps, the ledger, smoke, the compose env guard."""
