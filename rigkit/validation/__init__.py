"""rigkit.validation."""
