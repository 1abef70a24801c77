"""Which of the dead-letter topics were deleted and created again, told by their topic ids.

A partition deleted and created again shows it by its offsets when its end or its start went
back (see :func:`._ranges.where_to_start`), but not once the new topic grew past the old end
between two readings. Kafka gives each topic an id of its own (KIP-516), which a consumer's
metadata does not carry and an admin client's description of the topic does: :class:`TopicIds`
asks for it, :func:`renewed` says which topics changed ids. A cluster that gives no id (a zero
one) tells nothing this way: the offsets alone tell then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._adminsession import AdminSession
from .._errors import KafkaUnavailableError, TopicAdminError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from .._settings import Settings


class TopicIds:
    """An admin client kept to ask for the ids of the same topics again and again (made at
    the first :meth:`read`, so that an index never refreshed opens no connection)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._session: AdminSession | None = None

    def read(self, topics: Iterable[str], timeout: float) -> dict[str, str]:
        """The id of each of ``topics`` that Kafka gives one. A topic that Kafka does not
        describe (missing, not authorized) has none here: reading its offsets says why.
        Raises :class:`KafkaUnavailableError` when Kafka does not answer within ``timeout``."""
        if self._session is None:
            self._session = AdminSession(self.settings, timeout)
        session = self._session
        session.restart_deadline(timeout)
        ids: dict[str, str] = {}
        try:
            described = session.describe(list(topics))
        except KafkaUnavailableError:
            self._session = None  # asked with a new client next time (see BacklogReader.read)
            raise
        for name, found in described.items():
            topic_id = None if isinstance(found, TopicAdminError) else found.topic_id
            if topic_id is not None and (
                topic_id.get_most_significant_bits() or topic_id.get_least_significant_bits()
            ):
                ids[name] = str(topic_id)
        return ids

    def close(self) -> None:
        self._session = None  # an AdminClient has no close(): it goes with its last reference


def renewed(seen: Mapping[str, str], now: Mapping[str, str]) -> set[str]:
    """The topics whose id went from the one in ``seen`` to another in ``now``: deleted and
    created again in between."""
    return {topic for topic, topic_id in now.items() if seen.get(topic, topic_id) != topic_id}
