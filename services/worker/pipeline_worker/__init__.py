"""``pipeline-worker``: consumes the priority topics of a pipeline application and runs its jobs.

Run it with ``pipeline-worker --app myproject.jobs:app`` or embed it::

    from pipeline_worker import Worker
    Worker(app).run()

See docs/worker.md for how it works and how to operate it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline import TimeLimitError

    from ._middleware import Middleware
    from ._runtime import Worker
    from .route.outcome import Outcome, OutcomeKind, PartitionRef

__all__ = [
    "Middleware",
    "Outcome",
    "OutcomeKind",
    "PartitionRef",
    "TimeLimitError",
    "Worker",
    "main",
]

_LAZY = {
    "Middleware": "._middleware",
    "Outcome": ".route.outcome",
    "OutcomeKind": ".route.outcome",
    "PartitionRef": ".route.outcome",
    "TimeLimitError": "pipeline",
    "Worker": "._runtime",
}


def main() -> None:
    """The ``pipeline-worker`` command (``pipeline-worker --help``).

    Stop signals are caught before anything heavy is imported: a worker stopped while it still
    starts exits cleanly instead of dying of the signal. The process ends without the
    interpreter's finalization (see :mod:`pipeline._processend`).
    """
    from . import _signals

    _signals.catch_early()
    from pipeline._processend import run_then_end

    from ._cli import command

    run_then_end(lambda: command(prog_name="pipeline-worker"))


def __getattr__(name: str) -> Any:
    # Imported on first use, so that `main` can catch signals before the heavy imports.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline_worker' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
