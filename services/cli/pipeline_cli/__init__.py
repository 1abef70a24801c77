"""The ``pipeline`` command: topics, enqueue, the local dev broker (and more as they land)."""

from ._main import cli, main

__all__ = ["cli", "main"]
