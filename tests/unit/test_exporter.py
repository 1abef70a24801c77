"""The exporter keeps serving through failed reads of Kafka, and says so in its metrics."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline._backlogmodel import Backlog
from pipeline._deadletters import INDEX_STEP
from pipeline._errors import KafkaUnavailableError
from pipeline._settings import Settings
from pipeline_cli._exporter import Exporter
from tests import waiting
from tests.integration.worker.harness.metrics import free_port
from tests.unit.metrics_exported import backlog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FlakyReader:
    """Fails while ``failing`` is set, else returns the snapshot."""

    def __init__(self, failure: Exception) -> None:
        self.failure = failure
        self.failing = True

    def read(self) -> Backlog:
        if self.failing:
            raise self.failure
        return backlog()


def sample(exporter: Exporter, name: str, **labels: str) -> float | None:
    return exporter.registry.get_sample_value(name, labels)


def test_failed_reads_are_counted_and_the_last_values_kept() -> None:
    clock = Clock()
    exporter = Exporter(Settings(), port=0, interval=15, timeout=10, clock=clock)
    reader = FlakyReader(KafkaUnavailableError("Kafka at localhost:9092 did not answer"))
    exporter.read_once(reader)
    assert sample(exporter, "pipeline_exporter_read_success") == 0
    assert sample(exporter, "pipeline_exporter_read_errors_total") == 1
    assert sample(exporter, "pipeline_queue_depth", priority="default") is None
    assert exporter.health() == (True, "last read failed: Kafka at localhost:9092 did not answer")

    reader.failing = False
    clock.now += 5
    exporter.read_once(reader)
    assert sample(exporter, "pipeline_exporter_read_success") == 1
    assert sample(exporter, "pipeline_exporter_last_success_timestamp_seconds") == 1005
    assert sample(exporter, "pipeline_queue_depth", priority="default") == 3
    assert exporter.health() == (True, "ok")

    reader.failing = True
    exporter.read_once(reader)
    assert sample(exporter, "pipeline_queue_depth", priority="default") == 3
    assert sample(exporter, "pipeline_exporter_read_errors_total") == 2
    clock.now += 3 * 15 + 10 + 1
    ok, detail = exporter.health()
    assert not ok
    assert "did not answer" in detail


def test_livez_fails_only_when_the_read_loop_stops_turning() -> None:
    """Failed reads (Kafka down) fail /healthz, not /livez: a restart would not bring Kafka
    back, and restarted in a loop the exporter would sit in back-off after the outage."""
    clock = Clock()
    exporter = Exporter(Settings(), port=0, interval=15, timeout=10, clock=clock)
    reader = FlakyReader(KafkaUnavailableError("Kafka at localhost:9092 did not answer"))
    for _ in range(20):  # 5 minutes of failed reads, one every 15 s
        clock.now += 15
        exporter.read_once(reader)
        assert exporter.live() == (True, "ok")
    assert not exporter.health()[0]
    clock.now += 3 * (15 + 10)  # the last read ended 75 s ago: still within the limit
    assert exporter.live() == (True, "ok")
    clock.now += 1
    assert exporter.live() == (False, "no read of the backlog ended for 76s (limit 75s)")


def test_a_bug_in_a_read_does_not_end_the_exporter() -> None:
    clock = Clock()
    exporter = Exporter(Settings(), port=0, interval=1, timeout=1, clock=clock)
    exporter.read_once(FlakyReader(KeyError("partition")))
    assert sample(exporter, "pipeline_exporter_read_errors_total") == 1
    clock.now += 10
    assert exporter.health() == (False, "last read failed: KeyError: 'partition'")


def status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_the_command_serves_read_errors_while_kafka_is_unreachable_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    port = free_port()
    command = [str(Path(sys.executable).parent / "pipeline"), "exporter", "--metrics-port"]
    log = tmp_path / "exporter.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, str(port), "--interval", "0.2", "--timeout", "0.5"],
            env={**os.environ, "PIPELINE_BOOTSTRAP_SERVERS": "127.0.0.1:1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def errors() -> float:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                return 0.0
            samples = {
                s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            }
            assert samples["pipeline_exporter_read_success"] == 0
            return samples["pipeline_exporter_read_errors_total"]

        assert waiting.wait_for(lambda: errors() >= 2, 30), log.read_text()
        # /healthz fails once no read worked for 3 intervals + the timeout; /livez does not
        assert waiting.wait_for(lambda: status(port, "/healthz") == 503, 30), log.read_text()
        assert status(port, "/livez") == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert "reading the backlog failed" in log.read_text()


def test_an_outage_is_logged_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    exporter = Exporter(Settings(), port=0, clock=Clock())
    reader = FlakyReader(KafkaUnavailableError("Kafka at localhost:9092 did not answer"))
    with caplog.at_level(logging.INFO, logger="pipeline.exporter"):
        for _ in range(5):
            exporter.read_once(reader)
        reader.failing = False
        exporter.read_once(reader)
        exporter.read_once(reader)
    assert [r.getMessage() for r in caplog.records] == [
        "reading the backlog failed",
        "reading the backlog works again",
    ]
    assert sample(exporter, "pipeline_exporter_read_errors_total") == 5


def test_an_outage_whose_error_librdkafka_repeats_is_still_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """librdkafka's repeat of an error says ", 1 identical error(s) suppressed": the outage was
    logged twice."""
    exporter = Exporter(Settings(), port=0, clock=Clock())
    cause = "Connect to ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT"
    reader = FlakyReader(KafkaUnavailableError(f"{cause})"))
    with caplog.at_level(logging.INFO, logger="pipeline.exporter"):
        exporter.read_once(reader)
        reader.failure = KafkaUnavailableError(f"{cause}, 1 identical error(s) suppressed)")
        exporter.read_once(reader)
    assert [r.getMessage() for r in caplog.records] == ["reading the backlog failed"]


def test_deferred_help_counts_the_jobs_the_scheduler_holds() -> None:
    # The scheduler leader commits <ns>.deferred only when it releases a job: a job it has
    # read and holds in memory is still in the depth, which the help must not deny.
    exporter = Exporter(Settings(), port=0)
    (family,) = (f for f in exporter.registry.collect() if f.name == "pipeline_deferred_depth")
    assert "not read" not in family.documentation
    assert "not committed by the scheduler leader" in family.documentation


def test_the_dead_letters_are_counted_from_an_index_refreshed_at_each_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each read took ``<ns>.dlq`` whole, holding every whole letter (about 7 KB each): a
    deep DLQ outgrew the exporter's memory limit at every interval."""
    from pipeline_cli import _exporter

    calls: list[str] = []

    class Index:
        def __init__(self, settings: Settings, *, timeout: float) -> None:
            calls.append(f"index {timeout:g}")

        def __enter__(self) -> Index:
            return self

        def __exit__(self, *exc: object) -> None:
            calls.append("index closed")

        caught_up = True

        def refresh(self, timeout: float, *, limit: int) -> None:
            calls.append(f"refresh {timeout:.1f} {limit}")

        def __len__(self) -> int:
            return 7

        def stats(self) -> str:
            calls.append("stats")
            return "counted"

    exporter = Exporter(Settings(namespace="ns"), port=0, interval=0.1, timeout=3.0)

    class Reader:
        def __init__(self, settings: Settings, *, timeout: float, dead_letters: Any) -> None:
            self.dead_letters = dead_letters

        def __enter__(self) -> Reader:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def read(self) -> Backlog:
            assert self.dead_letters(2.5) == "counted"
            exporter.stop()
            return backlog()

    monkeypatch.setattr(_exporter, "LetterIndex", Index)
    monkeypatch.setattr(_exporter, "BacklogReader", Reader)
    assert exporter.run() == 0
    assert calls == [
        "index 3",
        "refresh 2.5 20000",
        "stats",
        "index closed",
    ]  # a first step: all of it


def test_a_deep_dead_letter_topic_is_indexed_in_steps_kept_from_one_read_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipeline_cli import _exporter

    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])

    class Deep:
        """Each step takes 4 s and reads one of 5 steps' worth; a step given less time fails
        once that time is up, as the index's reader does (or at once while Kafka is down)."""

        read = 0
        down = False

        @property
        def caught_up(self) -> bool:
            return self.read == 5

        def refresh(self, timeout: float, *, limit: int) -> None:
            if self.down or timeout < 4.0:
                clock[0] += timeout
                raise KafkaUnavailableError("pipeline.dlq not read to the end")
            clock[0] += 4.0
            self.read += 1

        def __len__(self) -> int:
            return self.read * INDEX_STEP

        def stats(self) -> object:
            return "the letters so far"

    deep = Deep()
    count = _exporter.indexed(deep)  # type: ignore[arg-type]
    for read in range(1, 6):  # half of 12 s fits one step and fails the next: the read succeeds
        assert count(12.0) == "the letters so far"  # type: ignore[comparison-overlap]
        assert deep.read == read  # the next read goes on from there
    assert deep.caught_up
    deep.down = True
    with pytest.raises(KafkaUnavailableError):  # no step went through: Kafka is not answering
        count(12.0)
    deep.down, deep.read = False, 0
    assert count(5.0) == "the letters so far"  # type: ignore[comparison-overlap]
    assert deep.read == 1  # a first step longer than half of the time still goes through


def test_a_read_succeeds_while_a_deep_dead_letter_topic_is_still_indexed() -> None:
    """The first reads of a deep ``<ns>.dlq`` failed until the index reached its end: no depth
    of any job topic was served, and the exporter looked down to its alerts meanwhile."""

    class Letters:
        caught_up = False

        def __len__(self) -> int:
            return 40_000

    class Reader:
        def read(self) -> Backlog:
            return backlog()

    clock = Clock()
    exporter = Exporter(Settings(), port=0, interval=15, timeout=10, clock=clock)
    letters = Letters()
    exporter.read_once(Reader(), letters)  # type: ignore[arg-type]
    assert sample(exporter, "pipeline_exporter_read_success") == 1
    assert sample(exporter, "pipeline_queue_depth", priority="default") == 3
    assert sample(exporter, "pipeline_exporter_dead_letters_indexed") == 40_000
    assert sample(exporter, "pipeline_dead_letters_pending") is None  # partial: left out
    assert sample(exporter, "pipeline_dead_letters_retained", status="pending") is None
    clock.now += 3 * 15 + 10 + 1
    assert exporter.health() == (True, "ok")

    letters.caught_up = True
    exporter.read_once(Reader(), letters)  # type: ignore[arg-type]
    assert sample(exporter, "pipeline_dead_letters_pending") == 1
    assert sample(exporter, "pipeline_dead_letters_retained", status="replayed") == 2
