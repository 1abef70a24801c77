"""What a worker answers its orchestrator's probes: ``/livez``, whether its loops turn (what a
restart mends), and ``/healthz``, that and Kafka reachable."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .intake.assignment import READ_MARKS_S
from .recovery.poison import WATERMARKS_TIMEOUT_S

if TYPE_CHECKING:
    from pipeline._brokerhealth import BrokerHealth

    from .intake.consumer import ConsumerThread

Answer = tuple[bool, str]
"""Whether the probe passes, and why (the body of the answer)."""

STUCK_S = 15.0
"""How long the consumer thread may go without a poll, or the event loop without a turn."""


def live(consumer: ConsumerThread | None, loop_beat: float, revoke_grace_s: float) -> Answer:
    """Whether the consumer thread polled and the event loop (its heartbeat at ``loop_beat``)
    turned recently; ``consumer`` None: the worker is starting."""
    if consumer is None:
        return False, "starting"
    now = time.monotonic()
    limit = max(STUCK_S, revoke_grace_s + 5.0)
    if consumer.done.is_set():
        return False, "the consumer is closed"
    silent = now - consumer.last_poll
    if consumer.reading_back:
        # Reading back new partitions holds the polls, each step within its own timeout
        # (then it fails): their commit marks, then, for those whose previous owner did not
        # leave cleanly, their watermarks, one partition after another. No stuck consumer.
        # Their keys are restored on a helper thread, polls going on (intake/keyload.py).
        limit += READ_MARKS_S + WATERMARKS_TIMEOUT_S * len(consumer.states)
    if silent > limit:
        return False, f"the consumer has not polled for {silent:.0f}s"
    if now - loop_beat > limit:
        return False, f"the event loop has been blocked for {now - loop_beat:.0f}s"
    return True, "ok"


def healthy(alive: Answer, health: BrokerHealth, unhealthy_after_s: float) -> Answer:
    """``alive``, failed once Kafka has been unreachable for ``unhealthy_after_s``."""
    down = health.unreachable_for()
    if alive[0] and down is not None and down >= unhealthy_after_s:
        return False, health.describe()
    return alive
