"""examples/outbox_orders.py, which docs/outbox.md shows: an order and its job commit together."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from examples.outbox_orders import open_shop, place_order

from pipeline import PayloadValidationError
from pipeline._codec import JobCodec


def test_an_order_and_its_email_commit_together(tmp_path: Path) -> None:
    connection = open_shop(str(tmp_path / "shop.db"))
    order_id = place_order(connection, "ann@example.com")
    reader = sqlite3.connect(tmp_path / "shop.db")  # another connection sees both committed
    assert reader.execute("SELECT id, email FROM orders").fetchall() == [
        (order_id, "ann@example.com")
    ]
    [(topic, key, value)] = reader.execute("SELECT topic, key, value FROM pipeline_outbox")
    job = JobCodec().decode(value)
    assert (topic, key) == ("pipeline.jobs.high", f"order-confirmation:{order_id}".encode())
    assert json.loads(job.payload) == {
        "to": "ann@example.com",
        "subject": f"Order {order_id} confirmed",
    }


def test_a_job_that_fails_validation_rolls_the_order_back(tmp_path: Path) -> None:
    connection = open_shop(str(tmp_path / "shop.db"))
    with pytest.raises(PayloadValidationError):
        place_order(connection, 42)  # type: ignore[arg-type]  # the handler wants a str
    assert connection.execute("SELECT count(*) FROM orders").fetchone() == (0,)
    assert connection.execute("SELECT count(*) FROM pipeline_outbox").fetchone() == (0,)
