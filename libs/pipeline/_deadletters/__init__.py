"""Dead letters: read ``<ns>.dlq`` with what was done to each, filter, replay and discard.

``<ns>.dlq`` is append-only and written by workers in Kafka transactions. What an operator did
with a dead letter lives on the compacted one-partition ``<ns>.dlq-state`` topic, keyed by
dead-letter id, as JSON (``{"status": "replayed", "at": ms, "by": "user@host", "to": topic,
"job_id": ...}``; the later record for a key wins). A replay or discard writes the jobs, their
state records and their lifecycle events in one transaction per batch, with the transactional id
``<ns>.dlq-cli``: a crash never replays a dead letter without recording it, nor the reverse, and
a second command of the namespace fences the first one (which then fails) before it reads the
state, so the two never act on the same dead letter.
"""

from __future__ import annotations

from ._replay import (
    DeadLetterNotFoundError,
    DeadLetterSnapshot,
    DlqStats,
    LetterFilter,
    LetterState,
    LetterStatus,
    Outgoing,
    StoredLetter,
    WriteReport,
    actionable,
    discard_letters,
    dlq_depth,
    dlq_stats,
    dlq_transactional_id,
    fold_states,
    parse_when,
    read_dead_letters,
    read_states,
    replay_job,
    replay_letters,
    replay_message,
)
from ._replay import (
    _Reader as _Reader,  # reads any topic to its end, committed records only
)

__all__ = [
    "DeadLetterNotFoundError",
    "DeadLetterSnapshot",
    "DlqStats",
    "LetterFilter",
    "LetterState",
    "LetterStatus",
    "Outgoing",
    "StoredLetter",
    "WriteReport",
    "actionable",
    "discard_letters",
    "dlq_depth",
    "dlq_stats",
    "dlq_transactional_id",
    "fold_states",
    "parse_when",
    "read_dead_letters",
    "read_states",
    "replay_job",
    "replay_letters",
    "replay_message",
]
