"""The retry tiers the relay reads: those the settings name, and those left from before.

A tier removed from ``topics.retry_delays_s`` (the last ones, or a middle one, which renumbers
the rest) keeps its topic and the jobs waiting there; no worker writes to it any more. The relay
reads every ``<ns>.retry.<n>`` the cluster has at its start, so that those jobs still come back:
each when due, or, due later than a tier it does not know allows, by way of ``<ns>.deferred``
(:mod:`.detours`), even when the settings name no tier at all; with no tier either way, the
relay ends before it joins its group. A tier the settings name and the cluster lacks is a
setup error that stops the worker; one left from before may be deleted at any time.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException

from pipeline._errors import TopicMissingError
from pipeline._topiccheck import missing_topics
from pipeline._topics import TopicNames

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline import Settings
    from pipeline._topiccheck import MetadataClient

_log = logging.getLogger("pipeline.worker.relay")

LOOKUP_S = 5.0
"""How long one look at the cluster's topics may take."""


class Tiers:
    """The tier topics of one namespace, for the relay's consumer ``client``."""

    def __init__(self, settings: Settings, client: MetadataClient) -> None:
        self._names = names = TopicNames(settings.namespace)
        self.configured = [names.retry(i) for i in range(len(settings.topics.retry_delays_s))]
        self._namespace = settings.namespace
        self._client = client

    def left_over(self) -> list[str]:
        """The tiers on the cluster beyond those the settings name, in order (raises
        ``KafkaException`` when the cluster does not answer)."""
        found = self._client.list_topics(timeout=LOOKUP_S).topics
        numbered = ((self._names.tier_number(name), name) for name in found)
        extra = {number: name for number, name in numbered if number is not None}
        return [extra[n] for n in sorted(extra) if n >= len(self.configured)]

    def to_read(self, stopped: Callable[[float], bool]) -> list[str] | None:
        """Every tier to subscribe to; while the cluster does not answer, asked again until
        ``stopped(seconds)`` says a stop came (then None)."""
        while True:
            try:
                extra = self.left_over()
            except KafkaException as exc:
                _log.debug("retry relay: could not list the retry tiers: %s", exc)
                if stopped(1.0):
                    return None
                continue
            if extra:
                _log.warning(
                    "retry tiers %s are not in topics.retry_delays_s: the relay returns the jobs "
                    "still waiting there (delete them once empty)",
                    ", ".join(extra),
                )
            return self.configured + extra

    def check(self) -> None:
        """Raise :class:`TopicMissingError` if a configured tier is missing (the consumer said
        a subscribed topic is); a left-over tier deleted meanwhile is no error."""
        try:
            missing = missing_topics(self._client, self.configured, timeout=LOOKUP_S)
        except KafkaException as exc:  # asked again when the consumer says so again
            _log.debug("retry relay: could not check the retry tiers: %s", exc)
            return
        if missing:
            raise TopicMissingError(missing, self._namespace)
