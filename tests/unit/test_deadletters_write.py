"""``replay_letters`` when Kafka stops answering during a commit, without Kafka."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from pipeline import JobCodec, Settings
from pipeline._deadletters import (
    LetterState,
    LetterStatus,
    StoredLetter,
    _replay,
    replay_letters,
    replay_targets,
)
from pipeline._errors import (
    KafkaUnavailableError,
    PipelineError,
    TransactionError,
    TransactionFencedError,
)
from pipeline._job import Job, Priority
from pipeline._records import DeadLetter


def kafka_of(
    monkeypatch: pytest.MonkeyPatch, txn: object, states: dict[str, LetterState] | None = None
) -> None:
    """The dead-letter commands write through ``txn``, read ``states`` (none by default) and
    find the namespace's default priority topic and state topic."""
    monkeypatch.setattr(_replay, "_dlq_transactions", lambda settings, timeout: (txn, None))
    monkeypatch.setattr(_replay, "read_states", lambda settings, timeout: states or {})
    monkeypatch.setattr(
        _replay, "_topics", lambda producer, settings, timeout: {"ns.jobs.default", "ns.dlq-state"}
    )


class FailsAt:
    """Transactions that commit until run ``failing``, which raises ``error``: before its
    commit, or (``committing``) in a commit Kafka did not confirm."""

    def __init__(self, failing: int, error: PipelineError, *, committing: bool = False) -> None:
        self.failing = failing
        self.error = error
        self.fails_committing = committing
        self.committing = False
        self.runs = 0

    def init(self) -> None:
        return None

    def run(self, write: Callable[[Any], None]) -> None:
        self.runs += 1
        if self.runs == self.failing:
            self.committing = self.fails_committing
            raise self.error

    def close(self) -> None:
        return None


UNCONFIRMED = KafkaUnavailableError(
    "Kafka did not confirm the producer's commit in 5 attempts; it goes on in the background "
    "and may yet be committed: commit again to learn its outcome"
)


def letters(count: int) -> list[StoredLetter]:
    return [
        StoredLetter(
            DeadLetter(
                id=f"dl-{n}",
                reason="max_attempts",
                message="boom",
                source_topic="ns.jobs.default",
                source_partition=0,
                source_offset=n,
                job=Job(id=f"job-{n}", type="email.send", payload=b"{}"),
            ),
            0,
            n,
        )
        for n in range(count)
    ]


def test_an_unconfirmed_commit_says_to_run_the_command_again_not_to_force_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The error told the operator to "commit again to learn its outcome", which a command
    cannot do; running it again is what learns it (and --force would send the batch twice)."""
    kafka_of(monkeypatch, FailsAt(3, UNCONFIRMED, committing=True))
    settings = Settings(namespace="ns", events="off")
    with pytest.raises(KafkaUnavailableError) as raised:
        replay_letters(settings, letters(5), batch_size=2, timeout=1.0)
    message = str(raised.value)
    assert "last batch of dead letters (1, after 4 committed)" in message
    assert "Run the same command again, without --force" in message
    assert "commit again" not in message


def test_a_failure_before_any_commit_is_passed_on_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    txn = FailsAt(1, UNCONFIRMED)

    def refused(write: Callable[[Any], None]) -> None:
        raise KafkaUnavailableError("nothing of the open transaction was committed")

    txn.run = refused  # type: ignore[method-assign]
    kafka_of(monkeypatch, txn)
    with pytest.raises(KafkaUnavailableError, match=r"^nothing of the open transaction"):
        replay_letters(Settings(namespace="ns", events="off"), letters(1), timeout=1.0)


@pytest.mark.parametrize(
    "error",
    [
        KafkaUnavailableError("Kafka did not let the producer begin a transaction"),
        TransactionError("the transaction was aborted"),
        TransactionFencedError("another replay started and stopped this one", "fenced"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_failure_after_committed_batches_says_not_to_force_the_next_run(
    monkeypatch: pytest.MonkeyPatch, error: PipelineError
) -> None:
    """Batches committed before the failure are done: the same command run again with --force
    would send their jobs a second time. Every error says so, not only an unconfirmed commit."""
    kafka_of(monkeypatch, FailsAt(3, error))
    with pytest.raises(type(error)) as raised:
        replay_letters(Settings(namespace="ns", events="off"), letters(5), batch_size=2)
    message = str(raised.value)
    assert message.startswith(str(error))
    assert "4 dead letters were done in the batches committed before" in message
    assert "without --force" in message
    if isinstance(error, TransactionFencedError):
        assert isinstance(raised.value, TransactionFencedError)
        assert raised.value.reason == "fenced"


class Recorded:
    """Transactions that commit every unit, keeping what each wrote."""

    committing = False

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None]] = []

    def init(self) -> None:
        return None

    def run(self, write: Callable[[Any], None]) -> None:
        write(self)

    def produce(self, topic: str, value: bytes | None, key: bytes | None, **kw: Any) -> None:
        self.records.append((topic, value))

    def close(self) -> None:
        return None


def letter_of(letter_id: str, job_id: str, attempt: int, dead_at: int) -> DeadLetter:
    job = Job(id=job_id, type="email.send", payload=b"{}", attempt=attempt)
    return DeadLetter(
        id=letter_id,
        reason="max_attempts",
        message="boom",
        source_topic="ns.jobs.default",
        source_partition=0,
        source_offset=dead_at,
        dead_at=dead_at,
        job=job,
    )


def test_a_forced_replay_sends_a_job_once_with_its_newest_letter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """job-1 was dead-lettered, replayed, failed again and was dead-lettered again: `dlq replay
    --id job-1 --force` took both letters and sent the job twice (it ran twice)."""
    replayed = LetterState(status=LetterStatus.REPLAYED, at=5, by="ops@host", to="ns.jobs.default")
    chosen = [
        StoredLetter(letter_of("dl-old", "job-1", attempt=3, dead_at=10), 0, 0, replayed),
        StoredLetter(letter_of("dl-new", "job-1", attempt=6, dead_at=20), 0, 1),
        StoredLetter(letter_of("dl-other", "job-2", attempt=3, dead_at=15), 0, 2),
    ]
    txn = Recorded()
    kafka_of(monkeypatch, txn, {"dl-old": replayed})
    report = replay_letters(Settings(namespace="ns", events="off"), chosen, force=True)
    codec = JobCodec()
    sent = [codec.decode(v or b"") for topic, v in txn.records if topic == "ns.jobs.default"]
    # Once each, job-1 as its newest letter holds it (a replay counts one attempt more).
    assert sorted((job.id, job.attempt) for job in sent) == [("job-1", 7), ("job-2", 4)]
    states = [value for topic, value in txn.records if topic == "ns.dlq-state"]
    assert len(states) == 3  # every letter taken is marked replayed, the older one too
    assert {stored.letter.id for stored in report.done} == {"dl-old", "dl-new", "dl-other"}


class Units(Recorded):
    """:class:`Recorded`, keeping the topics each unit wrote to, unit by unit."""

    def __init__(self) -> None:
        super().__init__()
        self.units: list[list[str]] = []

    def run(self, write: Callable[[Any], None]) -> None:
        first = len(self.records)
        write(self)
        self.units.append([topic for topic, _ in self.records[first:]])


def test_the_older_letters_of_a_job_are_marked_in_the_transaction_that_sends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In batches of one letter, dl-old (older, so first) was marked replayed in a transaction
    of its own, and its job went with dl-new in the next: a command stopped between the two
    left dl-old replayed and nothing sent. The batches keep a job's letters together now."""
    chosen = [
        StoredLetter(letter_of("dl-old", "job-1", attempt=3, dead_at=10), 0, 0),
        StoredLetter(letter_of("dl-other", "job-2", attempt=3, dead_at=15), 0, 1),
        StoredLetter(letter_of("dl-new", "job-1", attempt=6, dead_at=20), 0, 2),
        StoredLetter(letter_of("dl-last", "job-3", attempt=3, dead_at=25), 0, 3),
    ]
    txn = Units()
    kafka_of(monkeypatch, txn)
    replay_letters(Settings(namespace="ns", events="off"), chosen, batch_size=1)
    job, state = "ns.jobs.default", "ns.dlq-state"
    # job-1's letters together (a batch over the size), then one letter a batch, oldest first.
    pair = sorted([job, state])
    assert [sorted(unit) for unit in txn.units] == [sorted([job, state, state]), pair, pair]
    codec = JobCodec()
    sent = [codec.decode(v or b"").id for topic, v in txn.records if topic == job]
    assert sent == ["job-1", "job-2", "job-3"]


def _empty_letter() -> DeadLetter:
    """A message too large to keep whole in its letter: neither a job nor raw bytes."""
    return DeadLetter(
        id="dl-empty",
        reason="too_large",
        message="value left out",
        source_topic="ns.deferred",
        source_partition=0,
        source_offset=9,
        raw_key=b"big",
    )


def test_a_letter_with_nothing_to_send_is_left_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = [StoredLetter(_empty_letter(), 0, 9), *letters(2)]
    txn = Recorded()
    kafka_of(monkeypatch, txn)
    report = replay_letters(Settings(namespace="ns", events="off"), chosen)
    assert [stored.letter.id for stored in report.empty] == ["dl-empty"]
    assert {stored.letter.id for stored in report.done} == {"dl-0", "dl-1"}
    assert [topic for topic, _ in txn.records].count("ns.dlq-state") == 2  # none for dl-empty


def test_a_letter_with_nothing_to_send_discarded_since_it_was_read_is_skipped_as_such(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    discarded = LetterState(status=LetterStatus.DISCARDED, at=5, by="ops@host")
    kafka_of(monkeypatch, Recorded(), {"dl-empty": discarded})
    chosen = [StoredLetter(_empty_letter(), 0, 9)]
    report = replay_letters(Settings(namespace="ns", events="off"), chosen)
    assert (report.empty, dict(report.skipped)) == ([], {LetterStatus.DISCARDED: 1})


def test_the_older_letter_of_a_job_is_marked_replayed_where_its_job_went(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The older letter was of a job at the default priority, replayed with --priority high,
    which died again: it was marked replayed to the default topic, where nothing went."""
    replayed = LetterState(status=LetterStatus.REPLAYED, at=5, by="ops@host", to="ns.jobs.high")
    old, new = letter_of("dl-old", "job-1", 3, 10), letter_of("dl-new", "job-1", 6, 20)
    assert new.job is not None
    new = replace(new, job=replace(new.job, priority=Priority.HIGH))
    chosen = [StoredLetter(old, 0, 0, replayed), StoredLetter(new, 0, 1)]
    assert replay_targets(chosen, "ns") == ["ns.jobs.high", "ns.jobs.high"]  # what is asked
    txn = Recorded()
    kafka_of(monkeypatch, txn, {"dl-old": replayed})
    monkeypatch.setattr(
        _replay, "_topics", lambda producer, settings, timeout: {"ns.jobs.high", "ns.dlq-state"}
    )
    report = replay_letters(Settings(namespace="ns", events="off"), chosen, force=True)
    assert [topic for topic, _ in txn.records] == ["ns.dlq-state", "ns.jobs.high", "ns.dlq-state"]
    assert {s.letter.id: s.state and s.state.to for s in report.done} == {
        "dl-old": "ns.jobs.high",
        "dl-new": "ns.jobs.high",
    }


def test_a_job_that_cannot_be_encoded_again_names_its_letter_and_the_way_out() -> None:
    letter = letter_of("dl-1", "job-1", attempt=2**31 - 1, dead_at=10)  # another producer's
    with pytest.raises(PipelineError, match=r"dead letter dl-1: .*--reset-attempts"):
        replay_targets([StoredLetter(letter, 0, 0)], "ns")
    assert replay_targets([StoredLetter(letter, 0, 0)], "ns", reset_attempts=True) == [
        "ns.jobs.default"
    ]


def test_an_older_letter_that_cannot_be_encoded_does_not_stop_a_replay_that_does_not_send_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its job was replayed with --reset-attempts and died again: the newest letter sends it,
    as the dry run said, and the older one is only marked."""
    replayed = LetterState(status=LetterStatus.REPLAYED, at=5, by="ops@host", to="ns.jobs.default")
    chosen = [
        StoredLetter(letter_of("dl-old", "job-1", attempt=2**31 - 1, dead_at=10), 0, 0, replayed),
        StoredLetter(letter_of("dl-new", "job-1", attempt=3, dead_at=20), 0, 1),
    ]
    assert replay_targets(chosen, "ns") == ["ns.jobs.default", "ns.jobs.default"]  # the dry run
    txn = Recorded()
    kafka_of(monkeypatch, txn, {"dl-old": replayed})
    report = replay_letters(Settings(namespace="ns", events="off"), chosen, force=True)
    sent = [JobCodec().decode(v or b"") for t, v in txn.records if t == "ns.jobs.default"]
    assert [(job.id, job.attempt) for job in sent] == [("job-1", 4)]
    assert {stored.letter.id for stored in report.done} == {"dl-old", "dl-new"}
