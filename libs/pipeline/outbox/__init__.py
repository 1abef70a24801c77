"""A transactional outbox: jobs written in the service's own database transaction, then relayed.

``app.outbox(connection)`` returns an :class:`Outbox` whose ``enqueue`` adds the encoded job to
the outbox table in the connection's open transaction (``sqlite3`` or ``psycopg``); the job
exists if and only if that transaction commits. ``pipeline outbox relay --dsn ...`` (an
:class:`OutboxRelay`) publishes the committed rows to Kafka in order and deletes them once Kafka
has them. See docs/outbox.md.
"""

from ._dialect import DEFAULT_TABLE, DatabaseUnavailableError, connect
from ._options import RelayOptions, relay_transactional_id
from ._relay import OutboxRelay
from ._status import OutboxStatus, outbox_status
from ._writer import Outbox, create_table

__all__ = [
    "DEFAULT_TABLE",
    "DatabaseUnavailableError",
    "Outbox",
    "OutboxRelay",
    "OutboxStatus",
    "RelayOptions",
    "connect",
    "create_table",
    "outbox_status",
    "relay_transactional_id",
]
