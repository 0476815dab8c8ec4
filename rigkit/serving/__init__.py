"""rigkit.serving."""
