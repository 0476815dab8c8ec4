"""rigkit.settings."""
