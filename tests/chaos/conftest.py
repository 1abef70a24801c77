"""Long fault-injection runs of the worker (``make chaos``), on the worker tests' harness."""

from __future__ import annotations

from tests.integration.worker.fixtures import kit

__all__ = ["kit"]
