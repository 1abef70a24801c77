"""Pages that read Kafka while the monitor's readings find it unreachable: they answer at once
"Kafka is unreachable since <time>: <reason>" instead of waiting out their timeout; a timeout
while the readings reach Kafka says Kafka is slow. The monitor's readings are driven one at a
time (``_read_once``) with the status read replaced, and its clock is a :class:`FakeClock`."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import pytest
from starlette.testclient import TestClient

from pipeline import Settings
from pipeline._backlogmodel import GroupMembers
from pipeline._errors import KafkaUnavailableError, TopicMissingError
from pipeline._job import now_ms
from pipeline._status import StatusSnapshot
from pipeline_web import _jobsview, _letteractions, _monitor, _schedules
from pipeline_web._monitor import KafkaDownError, Monitor, Outage

from .conftest import T0, FakeClock, MakeDashboard
from .test_web_pages import _client, _csrf, _notice, dashboard

if TYPE_CHECKING:
    from starlette.applications import Starlette

DOWN = "Kafka at 127.0.0.1:1 did not answer within 10s (Connect to 127.0.0.1:1 failed: refused)"
SINCE = "2027-01-15T08:00:00Z"  # T0
TIMED_OUT = "Kafka at 127.0.0.1:1 did not answer within 10s (outage.events not read to the end)"


class _NoReader:
    """Stands for the :class:`BacklogReader` the monitor keeps open."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


class _Kafka:
    """What the monitor's status reads find: Kafka answering (``up``) or not."""

    def __init__(self) -> None:
        self.up = True
        self.problem: Exception = KafkaUnavailableError(DOWN)

    def read_status(self, settings: Settings, *, timeout: float, reader: object) -> StatusSnapshot:
        if not self.up:
            raise self.problem
        nobody = GroupMembers("g", "EMPTY", ())
        return StatusSnapshot(settings.namespace, int(T0 * 1000), (), (), (), nobody, nobody, 0, ())


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> _Kafka:
    found = _Kafka()
    monkeypatch.setattr(_monitor, "BacklogReader", _NoReader)
    monkeypatch.setattr(_monitor, "read_status", found.read_status)
    return found


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def app(
    make_dashboard: MakeDashboard, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> Starlette:
    made = make_dashboard("outage")
    monkeypatch.setattr(dashboard(made).monitor, "_clock", clock)
    return made


def _reading(app: Starlette) -> None:
    """One reading of the monitor, as its thread makes every ``web.refresh_s``."""
    dashboard(app).monitor._read_once(None)


class _Reads:
    """Stands for a page's read of Kafka: records the call, runs ``before_failing``, then
    fails as a read Kafka did not answer within its timeout."""

    def __init__(self) -> None:
        self.calls = 0
        self.before_failing: Callable[[], object] = lambda: None

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        self.calls += 1
        self.before_failing()
        raise KafkaUnavailableError(TIMED_OUT)


def _error_of(answer: Any) -> str:
    """The error a page or an action shows: the page's text, or the redirect's notice."""
    if answer.status_code == 303:
        return _notice(answer.headers["location"])
    return html.unescape(answer.text)


_PAGES = ["schedules", "job", "letter", "pause", "trigger", "replay"]


def _ask(app: Starlette, client: TestClient, page: str, monkeypatch: pytest.MonkeyPatch) -> _Reads:
    """Replace the Kafka read behind ``page`` by a :class:`_Reads`; the read to make."""
    reads = _Reads()
    if page == "schedules":
        monkeypatch.setattr(_schedules, "read_rows", reads)
    elif page == "job":
        monkeypatch.setattr(_jobsview, "job_history", reads)
    elif page == "letter":
        monkeypatch.setattr(dashboard(app).letters, "get", reads)
    elif page in ("pause", "trigger"):
        monkeypatch.setattr(_schedules, f"{page}_schedule", reads)
    else:
        monkeypatch.setattr(_letteractions, "read_dead_letters", reads)
        monkeypatch.setattr(dashboard(app).letters, "refresh", reads)
    return reads


def _request(client: TestClient, page: str) -> Any:
    if page == "schedules":
        return client.get("/schedules")
    if page == "job":
        return client.get("/jobs", params={"id": "job-1"})
    if page == "letter":
        return client.get("/dead-letters/dl-1")
    if page in ("pause", "trigger"):
        form = {"csrf": _csrf(client), "at": str(now_ms())}
        return client.post(f"/schedules/{page}?name=nightly", data=form)
    form = {"csrf": _csrf(client), "confirm": "yes", "at": str(now_ms()), "id": "dl-1"}
    return client.post("/dead-letters/replay", data=form)


# --- the monitor -------------------------------------------------------------------------------


def test_the_monitor_knows_since_when_kafka_does_not_answer_its_readings(kafka: _Kafka) -> None:
    clock = FakeClock()
    monitor = Monitor(Settings(namespace="outage"), refresh_s=1, history_s=10, clock=clock)
    monitor._read_once(None)
    assert (monitor.problem, monitor.outage) == (None, None)

    kafka.up = False
    monitor._read_once(None)
    assert monitor.outage == Outage(T0, DOWN)
    clock.now += 30
    kafka.problem = KafkaUnavailableError(f"{DOWN}; again")
    monitor._read_once(None)
    assert monitor.outage == Outage(T0, f"{DOWN}; again")  # since the first reading failed
    assert str(monitor.outage.error()) == f"Kafka is unreachable since {SINCE}: {DOWN}; again"

    kafka.problem = TopicMissingError(["outage.jobs.default"], "outage")
    monitor._read_once(None)
    assert monitor.problem is not None
    assert monitor.outage is None  # Kafka answered: the topics are missing, Kafka is up

    kafka.problem = KafkaUnavailableError(DOWN)
    monitor._read_once(None)
    assert monitor.outage == Outage(T0 + 30, DOWN)
    kafka.up = True
    monitor._read_once(None)
    assert (monitor.problem, monitor.outage) == (None, None)


# --- the pages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("page", _PAGES)
def test_a_page_fails_at_once_while_the_readings_find_kafka_unreachable(
    app: Starlette, kafka: _Kafka, monkeypatch: pytest.MonkeyPatch, page: str
) -> None:
    client = _client(app)
    reads = _ask(app, client, page, monkeypatch)
    kafka.up = False
    _reading(app)
    answer = _request(client, page)
    assert reads.calls == 0  # not tried: it would have waited its whole timeout
    assert answer.status_code in (303, 503)
    assert f"Kafka is unreachable since {SINCE}: {DOWN}" in _error_of(answer)


@pytest.mark.parametrize("page", _PAGES)
def test_a_page_reads_kafka_again_once_a_reading_succeeds(
    app: Starlette, kafka: _Kafka, monkeypatch: pytest.MonkeyPatch, page: str
) -> None:
    client = _client(app)
    reads = _ask(app, client, page, monkeypatch)
    kafka.up = False
    _reading(app)
    kafka.up = True
    _reading(app)
    answer = _request(client, page)
    assert reads.calls >= 1
    assert "unreachable since" not in _error_of(answer)


@pytest.mark.parametrize("page", _PAGES)
def test_a_timeout_while_the_readings_reach_kafka_says_kafka_is_slow(
    app: Starlette, kafka: _Kafka, monkeypatch: pytest.MonkeyPatch, page: str
) -> None:
    client = _client(app)
    reads = _ask(app, client, page, monkeypatch)
    _reading(app)  # Kafka answered it
    error = _error_of(_request(client, page))
    assert reads.calls >= 1
    assert f"Kafka is slow: it answered the dashboard's last reading (at {SINCE})" in error
    assert TIMED_OUT in error  # the timeout's own words
    assert "unreachable since" not in error


def test_a_read_kafka_stopped_answering_during_says_kafka_is_unreachable(
    app: Starlette, kafka: _Kafka, monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    client = _client(app)
    reads = _ask(app, client, "schedules", monkeypatch)
    _reading(app)

    def outage_meanwhile() -> None:  # the monitor's next reading fails while the page waits
        kafka.up = False
        clock.now += 5
        _reading(app)

    reads.before_failing = outage_meanwhile
    answer = client.get("/schedules")
    assert (answer.status_code, reads.calls) == (503, 1)
    assert "Kafka is unreachable since 2027-01-15T08:00:05Z" in html.unescape(answer.text)
    assert "slow" not in answer.text


def test_with_no_word_from_the_readings_a_timeout_keeps_its_own_words(
    app: Starlette, kafka: _Kafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _ask(app, _client(app), "schedules", monkeypatch)
    answer = _client(app).get("/schedules")  # before the monitor's first reading
    assert (answer.status_code, reads.calls) == (503, 1)
    assert TIMED_OUT in html.unescape(answer.text)
    assert "slow" not in answer.text
    assert "unreachable since" not in answer.text


def test_a_guarded_read_within_a_guarded_read_is_not_said_twice(kafka: _Kafka) -> None:
    monitor = Monitor(Settings(namespace="outage"), refresh_s=1, history_s=10, clock=FakeClock())
    monitor._read_once(None)

    def inner() -> NoReturn:
        raise KafkaUnavailableError(TIMED_OUT)

    with pytest.raises(KafkaUnavailableError) as slow:
        monitor.guarded(lambda: monitor.guarded(inner))
    assert str(slow.value).count("Kafka is slow") == 1
    kafka.up = False
    monitor._read_once(None)
    with pytest.raises(KafkaDownError, match=f"^Kafka is unreachable since {SINCE}: "):
        monitor.guarded(lambda: monitor.guarded(inner))
