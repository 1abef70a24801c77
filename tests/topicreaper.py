"""The topics of finished tests' namespaces, deleted from the session's Kafka.

Each test that asks for a ``namespace`` may create its whole set of topics, about a hundred
partitions, and a broker keeps a file open for each partition it holds: a suite run left one
node with more open files than a usual limit allows (20,000), and the node stopped for good
("Too many open files"). On a cluster named by ``PIPELINE_BOOTSTRAP_SERVERS`` the tests would
leave their topics behind too. So once a test is over, its namespace's topics are deleted, on a
thread of their own while the next test runs; what a deletion could not do is logged and left.
"""

from __future__ import annotations

import logging
import threading
from queue import Empty, SimpleQueue

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

_log = logging.getLogger("tests.topicreaper")
TIMEOUT_S = 30.0


class TopicReaper:
    """Deletes the topics of the namespaces handed to :meth:`reap`, several at once."""

    def __init__(self, servers: str) -> None:
        self._admin = AdminClient({"bootstrap.servers": servers, "log_level": 0})
        self._namespaces: SimpleQueue[str | None] = SimpleQueue()
        self.deleted = 0
        """Topics deleted so far."""
        self._thread = threading.Thread(target=self._main, name="topic-reaper", daemon=True)
        self._thread.start()

    def reap(self, namespace: str) -> None:
        """Delete the topics ``<namespace>.*`` (the caller does not wait)."""
        self._namespaces.put(namespace)

    def close(self, timeout: float = 2 * TIMEOUT_S) -> None:
        """Delete what was handed over so far, then stop."""
        self._namespaces.put(None)
        self._thread.join(timeout)

    def _main(self) -> None:
        while True:
            namespaces = [self._namespaces.get()]
            while True:  # the namespaces of the tests that ended meanwhile, in the same call
                try:
                    namespaces.append(self._namespaces.get_nowait())
                except Empty:
                    break
            names = [n for n in namespaces if n is not None]
            if names:
                self._delete(tuple(f"{name}." for name in names))
            if None in namespaces:
                return

    def _delete(self, prefixes: tuple[str, ...]) -> None:
        try:
            topics = [
                topic
                for topic in self._admin.list_topics(timeout=TIMEOUT_S).topics
                if topic.startswith(prefixes)
            ]
            if not topics:
                return
            futures = self._admin.delete_topics(topics, operation_timeout=TIMEOUT_S)
        except KafkaException as exc:
            _log.warning("could not list or delete the topics of %s: %s", prefixes, exc)
            return
        for topic, future in futures.items():
            try:
                future.result(TIMEOUT_S)
                self.deleted += 1
            except Exception as exc:  # deleted by its test already, Kafka down, or timed out
                _log.warning("could not delete topic %s: %s", topic, exc)
