"""The transactional outbox: rows relayed per second from PostgreSQL and SQLite, against enqueue.

``python -m ops.bench.outbox [--jobs N] [--batch-size B]`` (``make bench-outbox``; N is 100,000
by default) measures, on one broker (``PIPELINE_BOOTSTRAP_SERVERS``, else one started for the
run) and in one run:

1. the baseline: N jobs (``{"n": i}``) by ``app.enqueue``, one call each, until ``flush()``
   returned (every job acknowledged);
2. for a throwaway PostgreSQL (:mod:`ops.pgserver`) and a SQLite file: N jobs written through
   ``app.outbox(connection)`` in business transactions of 100 jobs (each with an order row),
   then one :class:`pipeline.outbox.OutboxRelay` (what ``pipeline outbox relay`` runs) started
   and timed from the moment it is active until the table is empty: every row published in a
   committed Kafka transaction and deleted.

The section is written to ``docs/benchmarks.md`` (``--output``) and printed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ops.pgserver import start_postgres
from pipeline import Pipeline, Settings
from pipeline.outbox import OutboxRelay, RelayOptions, connect, create_table

from .env import broker, fresh_namespace, machine, say
from .report import Measurement, Section, add_output_option, write_sections

TITLE = "Transactional outbox"
PER_TRANSACTION = 100
TIMEOUT_S = 600.0


def enqueue_directly(settings: Settings, jobs: int) -> float:
    """Seconds for ``jobs`` enqueues and the flush that has them all acknowledged."""
    app = Pipeline(settings)
    started = time.perf_counter()
    for n in range(jobs):
        app.enqueue("bench.noop", {"n": n})
    app.flush()
    seconds = time.perf_counter() - started
    app.close()
    return seconds


def write_outbox(settings: Settings, dsn: str, jobs: int, *, many: bool = False) -> float:
    """Seconds to commit ``jobs`` outbox jobs, each with an order row, in transactions of
    :data:`PER_TRANSACTION`: one ``enqueue`` per job, or one ``enqueue_many`` per transaction
    (``many``; then the orders go in with one ``executemany`` too)."""
    app = Pipeline(settings)
    connection, _ = connect(dsn)
    try:
        create_table(connection)
        cursor = connection.cursor()
        cursor.execute("CREATE TABLE IF NOT EXISTS orders (n INTEGER PRIMARY KEY)")
        cursor.execute("SELECT count(*) FROM orders")
        offset = int(cursor.fetchone()[0])
        connection.commit()
        insert = "INSERT INTO orders (n) VALUES (?)".replace(
            "?", "?" if dsn.startswith("sqlite:") else "%s"
        )
        outbox = app.outbox(connection)
        started = time.perf_counter()
        for first in range(offset, offset + jobs, PER_TRANSACTION):
            numbers = range(first, min(first + PER_TRANSACTION, offset + jobs))
            if many:
                cursor.executemany(insert, [(n,) for n in numbers])
                outbox.enqueue_many("bench.noop", ({"n": n} for n in numbers))
            else:
                for n in numbers:
                    cursor.execute(insert, (n,))
                    outbox.enqueue("bench.noop", {"n": n})
            connection.commit()
        return time.perf_counter() - started
    finally:
        connection.close()


def relay_all(settings: Settings, dsn: str, jobs: int, batch_size: int) -> float:
    """Seconds from the relay's being active until it has published and deleted ``jobs``."""
    relay = OutboxRelay(settings, dsn, RelayOptions(batch_size=batch_size))
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            relay.run(stop)
        except BaseException as exc:
            failure.append(exc)
            raise

    thread = threading.Thread(target=run, name="outbox-relay", daemon=True)
    thread.start()
    try:
        _wait(relay.active.is_set, failure, "the relay to become active")
        started = time.perf_counter()
        _wait(lambda: relay.relayed >= jobs, failure, f"the relay to publish {jobs:,} rows")
        return time.perf_counter() - started
    finally:
        stop.set()
        thread.join(60)


def _wait(condition: Callable[[], bool], failure: list[BaseException], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if failure:
            raise RuntimeError(f"the relay failed while waiting for {what}") from failure[0]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {TIMEOUT_S:g}s waiting for {what}")
        time.sleep(0.001)


def run(bootstrap_servers: str, description: str, jobs: int, batch_size: int) -> Section:
    command = f"python -m ops.bench.outbox --jobs {jobs} --batch-size {batch_size}"
    say(f"enqueue: {jobs:,} jobs")
    direct = Measurement(
        "`app.enqueue`, one call per job, until `flush()` returned",
        jobs,
        enqueue_directly(fresh_namespace(bootstrap_servers, "outbox-direct"), jobs),
        command,
    )
    rows: list[tuple[Measurement, Measurement | None]] = [(direct, None)]
    base = Path(tempfile.mkdtemp(prefix="pipeline-bench-outbox-"))
    # A directory of its own under the temporary directory: the server's user must reach it.
    pg_base = Path(tempfile.mkdtemp(prefix="pipeline-bench-postgres-"))
    try:
        postgres = start_postgres(pg_base)
        try:
            databases = [("PostgreSQL", postgres.dsn), ("SQLite", f"sqlite:///{base / 'bench.db'}")]
            for name, dsn in databases:
                settings = fresh_namespace(bootstrap_servers, f"outbox-{name.lower()}")
                say(f"{name}: writing {jobs:,} jobs through the outbox")
                written = write_outbox(settings, dsn, jobs)
                say(f"{name}: relaying them")
                relayed = relay_all(settings, dsn, jobs, batch_size)
                say(f"{name}: writing {jobs:,} jobs with enqueue_many")
                written_many = write_outbox(settings, dsn, jobs, many=True)
                rows.append(
                    (
                        Measurement(
                            f"{name}: outbox rows written, {PER_TRANSACTION} jobs and order "
                            "rows per transaction",
                            jobs,
                            written,
                            command,
                        ),
                        direct,
                    )
                )
                rows.append(
                    (
                        Measurement(
                            f"{name}: outbox rows written with `enqueue_many`, "
                            f"{PER_TRANSACTION} per transaction",
                            jobs,
                            written_many,
                            command,
                        ),
                        direct,
                    )
                )
                rows.append(
                    (
                        Measurement(
                            f"{name}: rows relayed (published in Kafka transactions of "
                            f"{batch_size}, then deleted)",
                            jobs,
                            relayed,
                            command,
                        ),
                        direct,
                    )
                )
        finally:
            postgres.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(pg_base, ignore_errors=True)
    facts: dict[str, Any] = machine()
    return Section(
        TITLE,
        f'{jobs:,} small jobs (`{{"n": i}}`) per line, on {description}. The baseline is direct '
        "`enqueue` (every job acknowledged); the outbox lines are the business transactions "
        "that write the jobs (with the broker not involved) and the relay that publishes them "
        "afterwards, timed from the moment it holds the lock until the table is empty. "
        '"vs raw" is the rate against direct `enqueue` in the same run. PostgreSQL runs '
        "with `fsync=off` (a throwaway cluster, `ops/pgserver.py`), on the same machine as "
        "the broker and the benchmark; SQLite in WAL mode. "
        f"Machine: {facts['nproc']} cores, {facts['CPU']}, Python {facts['Python']}, "
        f"librdkafka {facts['librdkafka']}.",
        rows,
        extra=[
            "The relay moves bytes encoded at write time: per row it reads, produces and "
            "deletes, and each batch costs one Kafka transaction (its rows and one record of "
            "their ids) and one database commit, milliseconds to tens of them whatever the "
            "batch's size: a run of `python -m ops.bench.outbox --jobs 100000 --batch-size 1000` "
            "just before this one relayed 34,501 rows/s from PostgreSQL and 28,723 from SQLite "
            "(44% and 36% of direct `enqueue`), hence the relay's default of 5,000. Writing "
            "through `enqueue` on PostgreSQL costs a round trip per statement (the order's and "
            "the job's); `enqueue_many` sends a transaction's jobs in one. One run, on a machine "
            "whose 2 cores other work shares, which moves every figure by up to a factor of two "
            "between runs (direct `enqueue` made 30,000 to 79,000 jobs/s across six): compare "
            "the ratios within a run. See docs/outbox.md."
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.outbox", description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per measurement")
    parser.add_argument("--batch-size", type=int, default=5000, help="the relay's batch size")
    add_output_option(parser)
    args = parser.parse_args(argv)
    with broker() as kafka:
        section = run(kafka.bootstrap_servers, kafka.description, args.jobs, args.batch_size)
    write_sections(args.output, [section])
    print(section.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
