"""The leader's transactional producer: every release, move and fire is part of a transaction.

The ``transactional.id`` is the same for every scheduler process of a namespace, so a new
leader's ``init_transactions()`` fences the previous one: a leader that was thought dead (a long
pause, a partition) can no longer commit. The transaction loop and its errors are the library's
(:mod:`pipeline._transactions`): a transaction Kafka aborted (:class:`TransactionAbortedError`)
or could not commit in time makes the leader rewind to the committed state, and so does a
producer that failed for good on an error that is not a fence
(:class:`TransactionProducerFailedError`: Kafka lost its transaction's state in a broker crash):
the next term registers a new producer. A fenced producer (:class:`TransactionFencedError`)
stops the process.

While Kafka is down each step of a transaction (sending the offsets, commit, abort, registering
the id) is tried :data:`ATTEMPTS` times, each call waiting at most :data:`STEP_TIMEOUT_S` (its
requests time out as soon: sending the offsets waits for its request, whatever the call's
timeout, 60 s by librdkafka's default here): a call returns as soon as Kafka answers, and an
outage costs the loop at most about :data:`ATTEMPTS` x :data:`STEP_TIMEOUT_S` per step (it was
five times 30 s per step: the commit, then the abort, then the next term's registration,
minutes in all). Between attempts the leader serves its leadership group (``serve``), so a
revocation is seen and its membership never lapses. A commit Kafka did not confirm may yet be
committed (the library's ``committing``): the term ends as after an abort, and the next
leader's ``init_transactions()`` waits until Kafka has decided it, so the state it reads is the
one committed either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from pipeline._acls import Role
from pipeline._brokerhealth import BrokerHealth
from pipeline._newclient import client
from pipeline._producer import producer_config
from pipeline._settings import Settings
from pipeline._transactions import STEP_TIMEOUT_S, Transactions, request_timeout_ms

__all__ = ["ATTEMPTS", "STEP_TIMEOUT_S", "leader_transactions", "transactional_id"]


def transactional_id(settings: Settings) -> str:
    return settings.scheduler.transactional_id or f"{settings.namespace}.scheduler"


ATTEMPTS = 5
"""Calls of one step; each waits at most the library's :data:`STEP_TIMEOUT_S` (the worker's
moves wait as long per call)."""
TRANSACTION_TIMEOUT_MS = 60_000


def leader_transactions(
    settings: Settings,
    timeout_s: float = STEP_TIMEOUT_S,
    serve: Callable[[float], None] | None = None,
) -> Transactions:
    """The leader's producer; opens a transaction on the first write of a batch. ``serve``
    waits between attempts of a step (the leadership group's poll; default: a sleep)."""
    txn_id = transactional_id(settings)
    conf: dict[str, Any] = producer_config(settings)
    conf.update(
        {
            "transactional.id": txn_id,
            "linger.ms": 1,
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            # Else sending the offsets waits 60 s for its request, whatever the call's timeout.
            "socket.timeout.ms": request_timeout_ms(TRANSACTION_TIMEOUT_MS, timeout_s),
            **BrokerHealth.of(settings.bootstrap_servers).callbacks("scheduler producer"),
        }
    )
    conf.update(settings.kafka)
    producer = client(Producer, conf)
    return Transactions(
        producer,
        name="the scheduler's transactional producer",
        when_fenced=(
            f"another scheduler of namespace {settings.namespace!r} took the lead "
            f"(transactional id {txn_id}); this one stops, its open transaction is not committed"
        ),
        timeout_s=timeout_s,
        attempts=ATTEMPTS,
        sleep=serve if serve is not None else time.sleep,
        acl=(txn_id, settings.security.sasl_username, Role.SCHEDULER.value),
    )
