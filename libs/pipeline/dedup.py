"""Idempotency keys and deduplication: the names a custom store builds on (docs/idempotency.md).

``Pipeline(dedup_store=...)`` takes any :class:`DedupStore`; without one, workers keep the keys
in the compacted ``<ns>.dedup`` topic.
"""

from ._dedup import ChangelogRecord, DedupMode, DedupPolicy, DedupTable, Outcome, Verdict
from ._dedupstores import DedupStore, MemoryDedupStore, PartitionTables

__all__ = [
    "ChangelogRecord",
    "DedupMode",
    "DedupPolicy",
    "DedupStore",
    "DedupTable",
    "MemoryDedupStore",
    "Outcome",
    "PartitionTables",
    "Verdict",
]
