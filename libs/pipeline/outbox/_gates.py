"""What holds a batch's rows from the first that may not go out yet, and what a batch Kafka did
not take changes for the next ones.

Each gate holds a row, and the rows after it, for one reason, and names it in an error line
(:mod:`._typegate`, :mod:`._topicgate`, :mod:`._sizegate`, :mod:`._refusalgate`); the relay
waits ``retry_s`` and reads again while a batch's first row is held. A batch Kafka did not take
has its topics looked up again (one deleted since would otherwise be taken as there for good),
and, when Kafka refused it rather than being away, it goes again in smaller batches.
"""

from __future__ import annotations

from .._topiccheck import MetadataClient
from ._batch import Batch
from ._dialect import OutboxRow
from ._refusalgate import RefusalGate, refusal_of
from ._sizegate import SizeGate
from ._topicgate import TopicGate
from ._typegate import TypeGate

__all__ = ["Gates"]


class Gates:
    """The gates of one active relay, in the order they ask."""

    def __init__(self, table: str, client: MetadataClient, max_bytes: int) -> None:
        self.types = TypeGate(table)
        self.topics = TopicGate(table, client)
        self.sizes = SizeGate(table, max_bytes)
        self.refusals = RefusalGate(table)

    def passable(self, batch: Batch) -> list[OutboxRow]:
        """The rows of ``batch`` that go out now: those before the first a gate holds."""
        rows = batch[: self.types.passable(batch)]
        rows = rows[: self.topics.passable(rows)]
        rows = rows[: self.sizes.passable(rows)]
        return rows[: self.refusals.passable(rows)]

    def not_taken(self, rows: list[OutboxRow], exc: Exception) -> bool:
        """Kafka did not take ``rows`` (``exc``). True: Kafka refused them, and the next
        batches find the row it refuses (logged), at once; False: Kafka was away or did not
        answer, and the rows wait for it as they are."""
        self.topics.forget({row[1] for row in rows})
        reason = refusal_of(exc)
        if reason is None:
            return False
        self.refusals.refused(rows, reason)
        return True
