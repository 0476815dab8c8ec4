"""rigkit.rollout."""
