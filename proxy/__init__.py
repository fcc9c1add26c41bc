"""context-proxy: an OpenAI-compatible reverse proxy that keeps agents inside their context window."""

__version__ = "0.1.0"
