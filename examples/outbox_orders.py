"""The transactional outbox: an order and its confirmation email commit together, or neither does.

``place_order`` writes the order row and the ``email.send`` job in one transaction of the
service's own database; ``pipeline outbox relay --dsn sqlite:///shop.db`` publishes the job once
that transaction has committed (docs/outbox.md). SQLite here; a ``psycopg`` connection to
PostgreSQL is used the same way (with ``%s`` placeholders in the service's own SQL).
"""

from __future__ import annotations

import sqlite3

from pipeline.outbox import create_table

from .app import app


def open_shop(path: str) -> sqlite3.Connection:
    """The service's database, with its orders table and the outbox table."""
    connection = sqlite3.connect(path)
    connection.execute(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, email TEXT NOT NULL)"
    )
    create_table(connection)  # or the DDL of docs/outbox.md in a migration
    return connection


def place_order(connection: sqlite3.Connection, email: str) -> int:
    """Store an order and enqueue its confirmation in the same transaction; the order's id."""
    with connection:  # commits on success, rolls back (order and job) on an exception
        cursor = connection.execute("INSERT INTO orders (email) VALUES (?)", (email,))
        order_id = cursor.lastrowid
        assert order_id is not None
        app.outbox(connection).enqueue(
            "email.send",
            {"to": email, "subject": f"Order {order_id} confirmed"},
            idempotency_key=f"order-confirmation:{order_id}",
        )
    return order_id
