"""Dead letters: read ``<ns>.dlq`` with what was done to each, filter, replay and discard.

``<ns>.dlq`` is append-only and written by workers in Kafka transactions. The modules:
``_state`` (what was done to each dead letter, from ``<ns>.dlq-state``), ``_reader`` (both
topics read to their ends), ``_filters`` (which letters a command acts on), ``_replay`` (replay
and discard, in transactions), ``_stats`` (counts, the depth to alert on) and ``_index`` (both
topics kept in memory and refreshed with what was added, for a dashboard).
"""

from __future__ import annotations

from ._filters import (
    EARLIEST_MS,
    LATEST_MS,
    LetterFilter,
    is_duration_ago,
    parse_when,
)
from ._index import (
    ALL,
    INDEX_STEP,
    LetterIndex,
    LetterPage,
    Refreshed,
    StatusChoice,
)
from ._outgoing import (
    Outgoing,
    leave_empty,
    nothing_to_replay,
    replay_job,
    replay_message,
    replay_targets,
    sendable,
    senders,
)
from ._reader import (
    _Reader as _Reader,  # reads any topic to its end, committed records only
)
from ._reader import (
    read_dead_letters,
    read_states,
)
from ._replay import (
    WriteReport,
    discard_letters,
    dlq_transactional_id,
    letters_done,
    replay_letters,
)
from ._state import (
    DeadLetterNotFoundError,
    DeadLetterSnapshot,
    LetterKey,
    LetterState,
    LetterStatus,
    StoredLetter,
    actionable,
    fold_states,
    letter_order,
)
from ._stats import (
    DlqStats,
    dlq_depth,
    dlq_stats,
)

__all__ = [
    "ALL",
    "EARLIEST_MS",
    "INDEX_STEP",
    "LATEST_MS",
    "DeadLetterNotFoundError",
    "DeadLetterSnapshot",
    "DlqStats",
    "LetterFilter",
    "LetterIndex",
    "LetterKey",
    "LetterPage",
    "LetterState",
    "LetterStatus",
    "Outgoing",
    "Refreshed",
    "StatusChoice",
    "StoredLetter",
    "WriteReport",
    "actionable",
    "discard_letters",
    "dlq_depth",
    "dlq_stats",
    "dlq_transactional_id",
    "fold_states",
    "is_duration_ago",
    "leave_empty",
    "letter_order",
    "letters_done",
    "nothing_to_replay",
    "parse_when",
    "read_dead_letters",
    "read_states",
    "replay_job",
    "replay_letters",
    "replay_message",
    "replay_targets",
    "sendable",
    "senders",
]
