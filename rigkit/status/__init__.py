"""rigkit.status."""
