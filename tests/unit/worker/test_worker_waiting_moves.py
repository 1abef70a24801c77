"""Moves waiting for room in their partition's commit mark (``commit/waiting.py``)."""

from __future__ import annotations

from pipeline_worker.commit.movetxn import Pending
from pipeline_worker.commit.waiting import WaitingMoves
from pipeline_worker.route.policy import Record

CHANGELOG = "ns.dedup"


def _move(where: tuple[str, int], submitted: int, key: bytes) -> Pending:
    pending = Pending(
        where, submitted, [Record(CHANGELOG, b"v", key, None, 0)], lambda ok: None, True
    )
    pending.submitted = submitted
    return pending


def test_moves_let_go_in_one_drain_are_not_counted_again_by_a_later_supersede() -> None:
    """Two moves of one partition go in the same drain, and each is written (and superseded,
    as the mover does) before the next is let go; a third, newer move of another partition
    still waits with the same key. The key stays held for it: the first move, gone already,
    is not taken for a waiting one when the second supersedes."""
    waiting = WaitingMoves(CHANGELOG)
    first, second = _move(("a", 0), 1, b"k"), _move(("a", 0), 2, b"k")
    newer = _move(("b", 0), 3, b"k")
    for pending in (first, second, newer):
        waiting.hold(pending)
    gone = []
    for pending in waiting.ready(lambda where, pending: where == ("a", 0)):
        gone.append(pending)
        waiting.supersede(pending)  # what Mover._write does once it is written
    assert gone == [first, second]
    assert first.records == [Record(CHANGELOG, b"v", b"k", None, 0)]  # written whole
    assert second.records == first.records
    assert waiting.holds_keys  # ``newer`` still waits with it
    assert waiting.drop(("b", 0)) == [newer]
    assert not waiting.holds_keys
    assert not waiting


def test_the_moves_that_stay_keep_their_order() -> None:
    waiting = WaitingMoves(CHANGELOG)
    moves = [_move(("a", 0), n, b"k%d" % n) for n in range(1, 6)]
    for pending in moves:
        waiting.hold(pending)
    gone = list(waiting.ready(lambda where, pending: pending.submitted % 2 == 0))
    assert gone == [moves[1], moves[3]]
    assert waiting.drop(("a", 0)) == [moves[0], moves[2], moves[4]]
