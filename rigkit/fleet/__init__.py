"""rigkit.fleet."""
