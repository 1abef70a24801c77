"""``LetterIndex`` against a real Kafka: it agrees with ``read_dead_letters`` for every filter,
status and page, through replays and discards, and a refresh reads only what was added."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from confluent_kafka.admin import AdminClient

from pipeline._admin import apply_topics
from pipeline._deadletters import (
    ALL,
    DeadLetterNotFoundError,
    LetterFilter,
    LetterIndex,
    LetterStatus,
    discard_letters,
    read_dead_letters,
    replay_letters,
)
from pipeline._job import now_ms
from pipeline._topics import TopicNames
from tests.integration.test_dlq_cli import email_letter, raw_letter, report_letter, write_letters
from tests.waiting import wait_for

if TYPE_CHECKING:
    from pipeline._settings import Settings

HOUR = 3_600_000


@pytest.fixture
def topics(settings: Settings) -> Settings:
    apply_topics(settings)
    return settings


def filters() -> list[LetterFilter]:
    return [
        LetterFilter(),
        LetterFilter(types=("email.*",)),
        LetterFilter(types=("report.build", "nope")),
        LetterFilter(reasons=("FATAL_ERROR",)),
        LetterFilter(error="(try 3)"),  # an earlier attempt's message
        LetterFilter(since=now_ms() - 24 * HOUR),
        LetterFilter(until=now_ms() - 24 * HOUR),
        LetterFilter(tenants=("acme",)),
        LetterFilter(ids=("email-2", "report-1")),
    ]


def assert_agrees(index: LetterIndex, settings: Settings) -> None:
    """Every filter, status and page of 2 as ``read_dead_letters`` + the state say."""
    snapshot = read_dead_letters(settings, timeout=20)
    assert len(index) == len(snapshot.letters)
    assert index.undecodable == snapshot.undecodable
    for letter_filter in filters():
        matching = snapshot.select(letter_filter)
        counts = {s.value: sum(m.status is s for m in matching) for s in LetterStatus}
        assert index.counts(letter_filter) == counts, letter_filter
        for status in [*LetterStatus, ALL]:
            wanted = [m for m in matching if status == ALL or m.status is status]
            newest = [(m.letter.id, m.status, m.offset) for m in reversed(wanted)]
            pages = [index.query(letter_filter, status=status, offset=o, limit=2) for o in (0, 2)]
            pages += [index.query(letter_filter, status=status, offset=4, limit=100)]
            got = [(s.letter.id, s.status, s.offset) for p in pages for s in p.letters]
            assert got == newest, (letter_filter, status)
            assert {p.total for p in pages} == {len(wanted)}
            assert all(p.by_status == counts for p in pages)
            oldest = index.query(letter_filter, status=status, limit=3, newest_first=False)
            assert [s.letter.id for s in oldest.letters] == [m.letter.id for m in wanted[:3]]


def test_the_index_agrees_with_the_commands_and_reads_only_what_was_added(
    topics: Settings,
) -> None:
    s = topics
    e1 = email_letter(s, 1, tenant="acme", dead_at=now_ms() - 3 * 24 * HOUR)
    e2, e3 = email_letter(s, 2), email_letter(s, 3, idempotency_key="welcome-3")
    r1, r2, raw = report_letter(s, 1), report_letter(s, 2), raw_letter(s)
    write_letters(s, [e1, e2, e3, r1, r2, raw], aborted=[email_letter(s, 9)])

    with LetterIndex(s, timeout=20) as index:
        first = index.refresh()
        assert (first.letters, first.states, first.undecodable) == (6, 0, 1)
        assert_agrees(index, s)

        snapshot = read_dead_letters(s, timeout=20)
        reports = snapshot.select(LetterFilter(types=("report.build",)))
        assert len(replay_letters(s, reports, timeout=20).done) == 2
        assert len(discard_letters(s, snapshot.select(LetterFilter(ids=(e2.id,)))).done) == 1
        second = index.refresh()
        assert (second.letters, second.states, second.undecodable) == (0, 3, 0)
        assert index.counts() == {"pending": 3, "replayed": 2, "discarded": 1}
        assert_agrees(index, s)

        e4, e5 = email_letter(s, 4, tenant="acme"), email_letter(s, 5)
        write_letters(s, [e4, e5], aborted=[email_letter(s, 10)])
        third = index.refresh()
        assert (third.letters, third.states, third.undecodable) == (2, 0, 1)
        newest = index.query(LetterFilter(types=("email.*",)), limit=2).letters
        assert [p.letter.id for p in newest] == [e5.id, e4.id]
        assert_agrees(index, s)
        assert index.refresh().letters == 0

        whole = index.get(e2.job_id or "")  # a job id, as `pipeline dlq show` takes
        assert whole.letter == e2
        assert whole.status is LetterStatus.DISCARDED
        assert index.get(raw.id).letter == raw
        assert index.get(e4.id).letter == e4
        with pytest.raises(DeadLetterNotFoundError, match="no dead letter or job with id"):
            index.get("no-such-id")


def test_a_dlq_recreated_and_grown_past_its_old_end_is_read_again_from_its_start(
    topics: Settings,
) -> None:
    """Told by its topic id: its offsets alone show nothing once the new topic grew past the
    old end, and the index kept the old letters and missed the new ones below that end."""
    s = topics
    dlq = TopicNames(s.namespace).dlq
    write_letters(s, [email_letter(s, n) for n in range(3)])
    with LetterIndex(s, timeout=20) as index:
        assert index.refresh().letters == 3

        admin = AdminClient({"bootstrap.servers": s.bootstrap_servers})
        admin.delete_topics([dlq], operation_timeout=10)[dlq].result(30)
        assert wait_for(lambda: dlq not in admin.list_topics(timeout=10).topics, 30)
        apply_topics(s)  # created again, as an operator would
        # The same keys (so the same partitions) written twice, in two transactions: each
        # partition that held letters grows past its old end.
        again = [email_letter(s, n) for n in range(3)]
        more = [email_letter(s, n) for n in range(3)]
        write_letters(s, again)
        write_letters(s, more)

        refreshed = index.refresh()
        assert {p.letter.id for p in index.query(status=ALL, limit=100).letters} == {
            letter.id for letter in again + more
        }
        assert (refreshed.letters, refreshed.expired) == (6, 3)
