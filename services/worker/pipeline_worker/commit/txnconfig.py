"""librdkafka options of a worker process's transactional producers: the moves' and the retry
relay's."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from pipeline._brokerhealth import BrokerHealth
from pipeline._producer import producer_config
from pipeline._transactions import request_timeout_ms

if TYPE_CHECKING:
    from pipeline import Settings

__all__ = ["transactional_config"]


def transactional_config(
    settings: Settings, role: str, source: str, *, timeout_s: float | None = None
) -> dict[str, Any]:
    """librdkafka options of a worker process's transactional producer (``role``: ``worker``
    for the moves, ``relay`` for the retry relay; ``source`` names it in outage reports).

    ``timeout_s``: the longest its transactions' calls are to wait, which bounds its requests
    too (:func:`pipeline._transactions.request_timeout_ms`; ``kafka`` may set another)."""
    conf: dict[str, Any] = producer_config(settings)
    txn_timeout_ms = settings.worker.transaction_timeout_ms
    conf.update(
        {
            "linger.ms": 1,
            "transaction.timeout.ms": txn_timeout_ms,
            # librdkafka wants a message's delivery to time out within its transaction's.
            "delivery.timeout.ms": txn_timeout_ms,
            **BrokerHealth.of(settings.bootstrap_servers).callbacks(source),
        }
    )
    if timeout_s is not None:
        conf["socket.timeout.ms"] = request_timeout_ms(txn_timeout_ms, timeout_s)
    conf.update(settings.kafka)
    # One id per process, whatever ``kafka`` says: fencing of a zombie comes from the consumer
    # group's generation, sent with the offsets (KIP-447), not from a shared transactional.id;
    # and a producer that fails for good is replaced by one that registers the id again, which
    # would fence any other process sharing it (pipeline._txnsteps).
    conf["transactional.id"] = f"{settings.namespace}.{role}.{uuid.uuid4().hex}"
    return conf
