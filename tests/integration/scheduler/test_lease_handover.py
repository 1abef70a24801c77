"""A scheduler that gives the lead up (its term would not start) hands it to a standby on a
real group, and gets it back where no other scheduler is (``Leadership.leave`` and
``rejoin``, which the runtime calls after its failed starts; see the unit tests)."""

from __future__ import annotations

from pipeline._settings import Settings
from pipeline_scheduler._leadership import Leadership
from tests.waiting import wait_for


def _serve(*members: Leadership) -> bool:
    """Serve the group protocol of each member once (false, for ``_serve(...) or ...``)."""
    for member in members:
        member.poll(0.05)
    return False


def test_the_lead_given_up_goes_to_the_standby_and_stays_there(topics: Settings) -> None:
    first = Leadership(topics)
    second: Leadership | None = None
    try:
        assert wait_for(lambda: _serve(first) or first.is_leader, 30)
        second = Leadership(topics)
        members = (first, second)
        assert wait_for(lambda: _serve(*members) or second._consumer.memberid() is not None, 30)
        assert first.is_leader
        assert not second.is_leader

        first.leave()
        assert wait_for(lambda: _serve(second) or second.is_leader, first.handover_s)
        first.rejoin()
        assert wait_for(lambda: _serve(*members) or first._consumer.memberid() is not None, 30)
        # The rebalance of the rejoin leaves the partition where it is: polled through a
        # session, the first process stands by.
        wait_for(
            lambda: _serve(*members) or first.is_leader, topics.scheduler.session_timeout_ms / 1000
        )
        assert second.is_leader
        assert not first.is_leader
    finally:
        first.close()
        if second is not None:
            second.close()


def test_the_lead_given_up_comes_back_where_no_one_else_is(topics: Settings) -> None:
    alone = Leadership(topics)
    try:
        assert wait_for(lambda: _serve(alone) or alone.is_leader, 30)
        alone.leave()
        assert not alone.is_leader
        alone.rejoin()
        assert wait_for(lambda: _serve(alone) or alone.is_leader, 30)
    finally:
        alone.close()
