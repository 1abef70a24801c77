"""``pipeline dlq replay`` against a real Kafka when someone else acts on the same letters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline._codec import JobCodec
from pipeline._deadletters import LetterStatus, read_dead_letters, replay_letters
from pipeline._topics import TopicNames

from .test_dlq_cli import email_letter, read_topic, topics, write_letters

if TYPE_CHECKING:
    from pipeline._settings import Settings

__all__ = ["topics"]  # the fixture, used by name


def test_a_forced_replay_skips_a_letter_someone_else_replayed_since_it_was_read(
    topics: Settings,
) -> None:
    settings = topics.model_copy(update={"events": "off"})
    jobs_topic = TopicNames(settings.namespace).jobs("default")
    letter = email_letter(settings, 1)
    write_letters(settings, [letter])
    # Two operators read the dead letter while it is pending, say at their confirmation prompts.
    seen_by_a = read_dead_letters(settings, timeout=20).find(letter.id)
    seen_by_b = read_dead_letters(settings, timeout=20).find(letter.id)
    assert seen_by_a.status is seen_by_b.status is LetterStatus.PENDING

    first = replay_letters(settings, [seen_by_a], timeout=20, by="a@ops")
    assert [s.letter.id for s in first.done] == [letter.id]
    # The second answers yes with --force: what it saw pending was replayed meanwhile.
    second = replay_letters(settings, [seen_by_b], force=True, timeout=20, by="b@ops")
    assert second.done == []
    assert second.skipped == {LetterStatus.REPLAYED: 1}
    sent = [JobCodec().decode(m.value).id for m in read_topic(settings, jobs_topic)]
    assert sent == [letter.job_id]

    # --force still replays again a letter that was replayed when the command read it.
    replayed = read_dead_letters(settings, timeout=20).find(letter.id)
    assert replayed.status is LetterStatus.REPLAYED
    again = replay_letters(settings, [replayed], force=True, timeout=20, by="a@ops")
    assert [s.letter.id for s in again.done] == [letter.id]
    sent = [JobCodec().decode(m.value).id for m in read_topic(settings, jobs_topic)]
    assert sent == [letter.job_id, letter.job_id]
