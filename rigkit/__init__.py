"""rigkit: identical, verified LLM-serving rigs with pyinfra."""

__version__ = "0.1.0"
