"""rigkit.remote."""
