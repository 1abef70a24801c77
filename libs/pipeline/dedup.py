"""Idempotency keys and deduplication: the names a custom store builds on (docs/idempotency.md).

``Pipeline(dedup_store=...)`` takes any :class:`DedupStore`; without one, workers keep the keys
in the compacted ``<ns>.dedup`` topic.
"""

from __future__ import annotations

import warnings

from ._dedup import (
    ChangelogRecord,
    DedupMode,
    DedupPolicy,
    DedupScope,
    KeyOutcome,
    Verdict,
)
from ._dedupstores import DedupStore, MemoryDedupStore, PartitionTables
from ._deduptable import DedupTable

__all__ = [
    "ChangelogRecord",
    "DedupMode",
    "DedupPolicy",
    "DedupScope",
    "DedupStore",
    "DedupTable",
    "KeyOutcome",
    "MemoryDedupStore",
    "PartitionTables",
    "Verdict",
]

_RENAMED = {"Outcome": "KeyOutcome"}
"""Old name -> new name: still importable, with a DeprecationWarning."""


def __getattr__(name: str) -> object:
    new = _RENAMED.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"pipeline.dedup.{name} is deprecated: use pipeline.dedup.{new} (the same class)",
        DeprecationWarning,
        stacklevel=2,
    )
    return globals()[new]
