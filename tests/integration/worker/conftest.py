"""Worker tests: real ``pipeline-worker`` processes against a real Kafka."""

from __future__ import annotations

from .fixtures import kit, schedulers

__all__ = ["kit", "schedulers"]
