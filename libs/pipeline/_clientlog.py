"""librdkafka's log lines for a client: kept at DEBUG, the last problem kept to explain why."""

from __future__ import annotations

import logging
import re

__all__ = ["ClientLog"]

_log = logging.getLogger("pipeline.kafka.admin")


class ClientLog:
    """librdkafka's log lines, kept at DEBUG; the last problem explains a failure's cause."""

    def __init__(self) -> None:
        self.last_problem: str | None = None

    def log(self, level: int, fmt: str, *args: object) -> None:
        text = fmt % args
        if level >= logging.WARNING and args:
            # "[thrd:host:9092/bootstrap]: host:9092/bootstrap: Connect to ... failed: ..."
            self.last_problem = re.sub(r"^\[thrd:[^\]]*\]: ", "", str(args[-1]))
        _log.debug("%s", text)
