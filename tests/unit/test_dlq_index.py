"""The dead-letter index without Kafka: records fed from an in-memory log, folded, queried."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import pytest

from pipeline._codec import DeadLetterCodec
from pipeline._deadletters import (
    ALL,
    DeadLetterNotFoundError,
    DeadLetterSnapshot,
    LetterFilter,
    LetterIndex,
    LetterState,
    LetterStatus,
    StoredLetter,
    _index,
    letter_order,
)
from pipeline._errors import PipelineError
from pipeline._job import AttemptError, Job
from pipeline._records import DeadLetter
from pipeline._settings import Settings

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MINUTE = 60_000
NS = "ns"
DLQ, STATE = f"{NS}.dlq", f"{NS}.dlq-state"
CODEC = DeadLetterCodec()


@dataclass
class FakeMessage:
    _topic: str
    _partition: int
    _offset: int
    _key: bytes | None
    _value: bytes | None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> None:
        return None


@dataclass
class FakeLog:
    """Partitions of committed records; ``None`` stands for a transaction marker. Stands in
    for the index's Kafka reader and records which ranges were read."""

    partitions: dict[tuple[str, int], list[tuple[bytes | None, bytes | None] | None]] = field(
        default_factory=lambda: {(DLQ, 0): [], (DLQ, 1): [], (STATE, 0): []}
    )
    low: dict[tuple[str, int], int] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)  # a topic's id, if the cluster gives one
    ranges: list[dict[tuple[str, int], tuple[int, int]]] = field(default_factory=list)
    closed: int = 0

    def add_letters(self, partition: int, letters: Iterable[DeadLetter | bytes]) -> None:
        records = self.partitions[DLQ, partition]
        for item in letters:
            value = item if isinstance(item, bytes) else CODEC.encode(item)
            records.append((None, value))
        records.append(None)  # the commit marker

    def add_states(self, records: Iterable[tuple[str, bytes | None]]) -> None:
        self.partitions[STATE, 0] += [(key.encode(), value) for key, value in records]
        self.partitions[STATE, 0].append(None)

    # --- what the index calls -----------------------------------------------------------

    def restart_clock(self, timeout: float) -> None:
        pass

    def watermarks(self, *topics: str) -> dict[tuple[str, int], tuple[int, int]]:
        return {
            where: (self.low.get(where, 0), len(records))
            for where, records in self.partitions.items()
            if where[0] in topics
        }

    def read_ranges(
        self,
        topics: Iterable[str],
        starts: Mapping[tuple[str, int], int],
        marks: Mapping[tuple[str, int], tuple[int, int]],
        keep: Callable[[FakeMessage], bool] | None = None,
    ) -> dict[str, list[FakeMessage]]:
        out: dict[str, list[FakeMessage]] = {topic: [] for topic in topics}
        self.ranges.append({w: (s, marks[w][1]) for w, s in starts.items() if marks[w][1] > s})
        for (topic, partition), start in starts.items():
            for offset in range(start, marks[topic, partition][1]):
                record = self.partitions[topic, partition][offset]
                if record is None:
                    continue
                message = FakeMessage(topic, partition, offset, *record)
                if keep is None or keep(message):
                    out[topic].append(message)
        return out

    def fetch(self, topic: str, partition: int, offset: int) -> FakeMessage:
        record = self.partitions[topic, partition][offset]
        assert record is not None
        return FakeMessage(topic, partition, offset, *record)

    def close(self) -> None:
        self.closed += 1


@dataclass
class FakeTopicIds:
    """Stands in for the index's reader of topic ids: the ids ``log`` gives."""

    log: FakeLog

    def read(self, topics: Iterable[str], timeout: float) -> dict[str, str]:
        return {topic: self.log.ids[topic] for topic in topics if topic in self.log.ids}

    def close(self) -> None:
        pass


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> FakeLog:
    fake = FakeLog()
    monkeypatch.setattr(_index, "_Reader", lambda settings, timeout, **options: fake)
    # raising=False: the tests of topic ids run (and fail) on an index without them.
    monkeypatch.setattr(_index, "TopicIds", lambda settings: FakeTopicIds(fake), raising=False)
    return fake


@pytest.fixture
def index(log: FakeLog) -> Iterable[LetterIndex]:
    with LetterIndex(Settings(namespace=NS)) as opened:
        yield opened


def dead_letter(
    n: int,
    job_type: str = "email.send",
    *,
    reason: str = "max_attempts",
    tenant: str | None = None,
    first_error: str = "smtp timed out",
    job_id: str | None = None,
) -> DeadLetter:
    errors = [
        AttemptError(
            attempt=1, at=NOW, error_class="smtplib.SMTPAuthenticationError",
            message=first_error, retryable=True, traceback_digest="abc", worker="w-1",
        ),
        AttemptError(
            attempt=2, at=NOW, error_class="builtins.TimeoutError", message="gave up",
            retryable=True,
        ),
    ]  # fmt: skip
    job = Job(
        id=job_id or f"job-{n}",
        type=job_type,
        payload=b'{"to": "someone@example.com", "pad": "' + b"x" * 300 + b'"}',
        attempt=2,
        max_attempts=2,
        tenant=tenant,
        headers={"traceparent": "00-1"},
        errors=errors,
    )
    return DeadLetter(
        id=f"dl-{n:03d}",
        reason=reason,
        message="gave up",
        error_class="builtins.TimeoutError",
        source_topic=f"{NS}.jobs.default",
        source_partition=0,
        source_offset=n,
        job=job,
        raw_key=job.id.encode(),
        dead_at=NOW + n * MINUTE,
        traceback="Traceback (most recent call last):\n" + "  ...\n" * 300,
    )


def replayed(letter_id: str) -> tuple[str, bytes]:
    state = LetterState(status=LetterStatus.REPLAYED, at=NOW, by="ada@ops", to=f"{NS}.jobs")
    return letter_id, state.to_json()


def discarded(letter_id: str) -> tuple[str, bytes]:
    return letter_id, LetterState(status=LetterStatus.DISCARDED, at=NOW, by="ada@ops").to_json()


def ids(letters: Iterable[StoredLetter]) -> list[str]:
    return [s.letter.id for s in letters]


LETTERS = [
    dead_letter(0, "email.send", tenant="acme"),
    dead_letter(1, "email.digest", first_error="mailbox full"),
    dead_letter(2, "report.build", reason="fatal_error", tenant="acme"),
    dead_letter(3, "email.send", reason="TIMEOUT", job_id="job-shared"),
    dead_letter(4, "billing.charge", tenant="globex", job_id="job-shared"),
    dead_letter(5, "email.send"),
]
FILTERS = [
    LetterFilter(),
    LetterFilter(types=("email.*",)),
    LetterFilter(types=("email.send", "report.*")),
    LetterFilter(reasons=("timeout",)),
    LetterFilter(error="MAILBOX"),  # only in the attempt history
    LetterFilter(error="authentication"),  # an attempt's error class
    LetterFilter(tenants=("acme",)),
    LetterFilter(since=NOW + 2 * MINUTE, until=NOW + 5 * MINUTE),
    LetterFilter(ids=("job-shared", "dl-000")),
    LetterFilter(types=("email.*",), tenants=("acme",)),
]


def fill(log: FakeLog) -> None:
    log.add_letters(0, LETTERS[0::2])
    log.add_letters(1, [*LETTERS[1::2], b"not a dead letter", CODEC.encode(LETTERS[1])])
    log.add_states([replayed("dl-001"), discarded("dl-002"), discarded("dl-005")])


def expected(letter_filter: LetterFilter, status: LetterStatus | None) -> list[str]:
    """What ``pipeline dlq ls`` selects from the same letters, newest first."""
    states = {"dl-001": LetterStatus.REPLAYED, "dl-002": LetterStatus.DISCARDED}
    states["dl-005"] = LetterStatus.DISCARDED
    snapshot = DeadLetterSnapshot(DLQ, [StoredLetter(d, 0, n) for n, d in enumerate(LETTERS)])
    chosen = snapshot.select(letter_filter)
    return [
        s.letter.id
        for s in chosen[::-1]
        if status is None or states.get(s.letter.id, LetterStatus.PENDING) is status
    ]


@pytest.mark.parametrize("letter_filter", FILTERS)
@pytest.mark.parametrize(
    "status", [LetterStatus.PENDING, LetterStatus.REPLAYED, LetterStatus.DISCARDED, None]
)
def test_query_selects_as_the_filters_of_the_commands_do(
    log: FakeLog, index: LetterIndex, letter_filter: LetterFilter, status: LetterStatus | None
) -> None:
    fill(log)
    index.refresh()
    page = index.query(letter_filter, status=ALL if status is None else status, limit=100)
    assert ids(page.letters) == expected(letter_filter, status)
    assert page.total == len(page.letters)
    assert (
        page.by_status
        == {s.value: len(expected(letter_filter, s)) for s in LetterStatus}
        == index.counts(letter_filter)
    )


def test_pages_newest_or_oldest_first(log: FakeLog, index: LetterIndex) -> None:
    fill(log)
    index.refresh()
    every = expected(LetterFilter(), None)
    pages = [index.query(status="all", offset=o, limit=2) for o in (0, 2, 4, 6)]
    assert [ids(p.letters) for p in pages] == [every[0:2], every[2:4], every[4:6], []]
    assert {p.total for p in pages} == {6}
    oldest = index.query(status=ALL, offset=1, limit=3, newest_first=False)
    assert ids(oldest.letters) == every[::-1][1:4]
    assert ids(index.query(status="pending").letters) == ["dl-004", "dl-003", "dl-000"]
    assert index.query(status=ALL, limit=0).letters == []
    with pytest.raises(ValueError, match="must not be negative"):
        index.query(offset=-1)
    with pytest.raises(ValueError, match="unknown status 'stale'; one of pending, replayed"):
        index.query(status="stale")  # type: ignore[arg-type]


def test_the_first_refresh_reads_everything_the_next_ones_only_what_was_added(
    log: FakeLog, index: LetterIndex
) -> None:
    fill(log)
    assert (len(index), index.refreshed_at) == (0, None)
    first = index.refresh()
    assert (first.letters, first.states, first.undecodable) == (6, 3, 1)
    assert index.refreshed_at is not None
    assert len(index) == 6  # the second copy of dl-001 is left out
    assert index.undecodable == 1
    assert log.ranges[0] == {(DLQ, 0): (0, 4), (DLQ, 1): (0, 6), (STATE, 0): (0, 4)}

    again = index.refresh()
    assert (again.letters, again.states, again.undecodable) == (0, 0, 0)
    assert log.ranges[1] == {}

    log.add_letters(1, [dead_letter(6, "email.send")])
    log.add_states([replayed("dl-000"), ("dl-002", None), ("dl-001", b"{not json")])
    third = index.refresh()
    assert (third.letters, third.states) == (1, 3)
    assert log.ranges[2] == {(DLQ, 1): (6, 8), (STATE, 0): (4, 8)}
    statuses = {s.letter.id: s.status for s in index.query(status=ALL, limit=100).letters}
    assert statuses == {
        "dl-000": LetterStatus.REPLAYED,
        "dl-001": LetterStatus.REPLAYED,  # the invalid record changes nothing
        "dl-002": LetterStatus.PENDING,  # a tombstone puts it back
        "dl-003": LetterStatus.PENDING,
        "dl-004": LetterStatus.PENDING,
        "dl-005": LetterStatus.DISCARDED,
        "dl-006": LetterStatus.PENDING,
    }
    assert index.counts() == {"pending": 4, "replayed": 2, "discarded": 1}


def test_letters_stay_in_dead_at_order_whatever_order_they_arrive_in(
    log: FakeLog, index: LetterIndex
) -> None:
    log.add_letters(0, [dead_letter(n) for n in (10, 11, 12)])
    index.refresh()
    log.add_letters(1, [dead_letter(n) for n in (13, 5, 11_000)])
    index.refresh()
    oldest = ids(index.query(status=ALL, newest_first=False).letters)
    assert oldest == ["dl-005", "dl-010", "dl-011", "dl-012", "dl-013", "dl-11000"]


def test_letters_deleted_by_retention_leave_the_index(log: FakeLog, index: LetterIndex) -> None:
    log.add_letters(0, [dead_letter(n) for n in range(4)])
    index.refresh()
    log.low[DLQ, 0] = 2  # dl-000 and dl-001 were deleted
    log.add_letters(0, [dead_letter(9)])
    refreshed = index.refresh()
    assert (refreshed.expired, refreshed.letters) == (2, 1)
    assert ids(index.query(status=ALL, newest_first=False).letters) == [
        "dl-002",
        "dl-003",
        "dl-009",
    ]
    with pytest.raises(DeadLetterNotFoundError):
        index.get("dl-000")


def test_summaries_leave_the_bulk_out_and_get_reads_the_whole_letter(
    log: FakeLog, index: LetterIndex
) -> None:
    fill(log)
    index.refresh()
    [summary] = index.query(LetterFilter(ids=("dl-001",)), status=ALL).letters
    assert summary.letter.job is not None
    assert (summary.letter.traceback, summary.letter.raw_key, summary.letter.job.payload) == (
        None,
        None,
        b"",
    )
    assert LETTERS[1].job is not None
    assert summary.letter.job.errors == LETTERS[1].job.errors
    assert summary.status is LetterStatus.REPLAYED

    whole = index.get("dl-001")
    assert whole.letter == LETTERS[1]
    assert (whole.partition, whole.offset, whole.status) == (1, 0, LetterStatus.REPLAYED)
    assert index.get("job-0").letter == LETTERS[0]  # a job id with one dead letter


def test_get_refuses_as_dlq_show_does(log: FakeLog, index: LetterIndex) -> None:
    fill(log)
    index.refresh()
    snapshot = DeadLetterSnapshot(DLQ, [StoredLetter(d, 0, 0) for d in LETTERS])
    for ident in ("job-shared", "nothing-like-it"):
        with pytest.raises(DeadLetterNotFoundError) as ours:
            index.get(ident)
        with pytest.raises(DeadLetterNotFoundError) as theirs:
            snapshot.find(ident)
        assert str(ours.value) == str(theirs.value)


def test_what_a_query_returned_does_not_change_with_a_later_refresh(
    log: FakeLog, index: LetterIndex
) -> None:
    fill(log)
    index.refresh()
    page = index.query(LetterFilter(ids=("dl-000",)))
    log.add_states([discarded("dl-000")])
    index.refresh()
    assert page.letters[0].status is LetterStatus.PENDING
    assert page.by_status["pending"] == 1
    assert index.query(LetterFilter(ids=("dl-000",)), status=ALL).letters[0].status == "discarded"


def test_queries_see_each_refresh_whole(log: FakeLog, index: LetterIndex) -> None:
    """A refresh folds a batch of 50 letters and their 50 state records at once: a query
    running meanwhile sees all of a batch or none of it."""
    batches, size = 40, 50
    problems: list[str] = []
    done = threading.Event()

    def refresh() -> None:
        for b in range(batches):
            letters = [dead_letter(b * size + n) for n in range(size)]
            log.add_letters(b % 2, letters)
            log.add_states(discarded(d.id) for d in letters[: size // 2])
            index.refresh()
        done.set()

    def query() -> None:
        while not done.is_set():
            page = index.query(LetterFilter(types=("email.*",)), status=ALL, limit=10)
            counts = page.by_status
            if page.total % size or counts["pending"] != counts["discarded"]:
                problems.append(f"a refresh seen in part: {page.total}, {counts}")

    threads = [threading.Thread(target=refresh), *(threading.Thread(target=query) for _ in "ab")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert done.is_set()
    assert problems == []
    assert len(index) == batches * size
    assert index.counts() == {"pending": 1000, "replayed": 0, "discarded": 1000}
    assert ids(index.query(status=ALL, limit=3).letters) == ["dl-1999", "dl-1998", "dl-1997"]
    assert sorted(index._letters, key=letter_order) == index._letters


def test_close_closes_both_consumers_once(log: FakeLog) -> None:
    index = LetterIndex(Settings(namespace=NS))
    fill(log)
    index.refresh()
    index.get("dl-000")
    with index:
        pass
    index.close()
    assert log.closed == 2
    with pytest.raises(PipelineError, match="closed"):
        index.refresh()
    with pytest.raises(PipelineError, match="closed"):
        index.get("dl-000")


def test_stats_count_as_dlq_stats_of_a_full_read_does(log: FakeLog, index: LetterIndex) -> None:
    fill(log)
    index.refresh()
    states = {"dl-001": "replayed", "dl-002": "discarded", "dl-005": "discarded"}
    stats = index.stats()
    assert stats.by_status == {"pending": 3, "replayed": 1, "discarded": 2}
    assert stats.depth == 3
    assert stats.undecodable == 1
    pending = [d for d in LETTERS if d.id not in states]
    assert dict(stats.pending_by_type) == dict(
        Counter(d.job_type or "(unknown)" for d in pending).most_common()
    )
    log.add_states([discarded("dl-000")])
    index.refresh()
    assert index.stats().depth == 2


def test_a_limited_refresh_reads_a_deep_topic_in_steps(log: FakeLog, index: LetterIndex) -> None:
    fill(log)
    assert not index.caught_up
    index.refresh(limit=2)  # one letter from each of the two partitions
    assert len(index) == 2
    assert not index.caught_up
    assert index.query(status="all", limit=10).total == 2
    steps = 1
    while not index.caught_up and steps < 10:
        index.refresh(limit=2)
        steps += 1
    assert steps == 6  # partition 1: three letters, a junk record, a duplicate, the marker
    assert sorted(ids(index.query(status="all", limit=10).letters)) == sorted(
        expected(LetterFilter(), None)
    )
    # The states read at the first step reached letters that came later.
    assert index.counts() == {"pending": 3, "replayed": 1, "discarded": 2}
