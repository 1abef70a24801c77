"""How a relay reads its table (:class:`RelayOptions`), and the transactional id of its relays."""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import ConfigurationError
from ._dialect import DEFAULT_TABLE, checked_table
from ._progress import MAX_IDS

__all__ = ["RelayOptions", "relay_transactional_id"]


@dataclass(frozen=True, slots=True)
class RelayOptions:
    """How a relay reads its table."""

    table: str = DEFAULT_TABLE
    batch_size: int = 5000
    """Rows per read, per Kafka transaction and per delete (a transaction costs tens of
    milliseconds whatever its size: docs/benchmarks.md, "Transactional outbox")."""
    batch_max_bytes: int = 64 * 2**20
    """Bytes of rows (values and keys) per batch: what the relay holds in memory while it
    publishes a batch. A single row larger than this is a batch of its own."""
    poll_interval_s: float = 0.1
    """How long an active relay waits before it reads an empty table again."""
    standby_retry_s: float = 1.0
    """How often a standby tries to take the lock."""
    retry_s: float = 2.0
    """How long the relay waits before it tries again a batch Kafka did not take."""

    def __post_init__(self) -> None:
        checked_table(self.table)
        for name, bound in (
            ("batch_size", self.batch_size),
            ("batch_max_bytes", self.batch_max_bytes),
        ):
            if bound < 1:
                raise ConfigurationError(f"{name} must be at least 1, got {bound}")
        if self.batch_size > MAX_IDS:  # its progress record must read back as a relay's
            raise ConfigurationError(
                f"batch_size must be at most {MAX_IDS:,}, got {self.batch_size}"
            )


def relay_transactional_id(namespace: str, table: str) -> str:
    """The transactional id of the relays of ``table``: ``<ns>.outbox-relay.<table>``."""
    return f"{namespace}.outbox-relay.{table}"
