"""A custom store that fails: the job runs (at least once) and the failure is logged, as
docs/idempotency.md says ("A store failure runs the job"); the job's run is not failed."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline import Pipeline
from pipeline.dedup import MemoryDedupStore
from pipeline.testing import InMemoryTransport
from pipeline_worker import OutcomeKind

from .support import Harness
from .test_worker_dedup import HeldMover, keyed, make, run


class BackendDown(MemoryDedupStore):
    """A store whose backend is down for ``check``, ``settle`` or both."""

    def __init__(self, *failing: str) -> None:
        super().__init__()
        self.failing = failing

    def check(self, *args: Any, **kwargs: Any) -> Any:
        if "check" in self.failing:
            raise ConnectionError("backend down")
        return super().check(*args, **kwargs)

    def settle(self, *args: Any, **kwargs: Any) -> Any:
        if "settle" in self.failing:
            raise ConnectionError("backend down")
        return super().settle(*args, **kwargs)


@pytest.mark.parametrize("failing", [("check",), ("settle",), ("check", "settle")])
def test_a_store_failure_runs_the_job_and_logs_it(
    failing: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[int] = []

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())

        @app.job("charge")
        async def charge(n: int) -> None:
            ran.append(n)

        dedup = make(BackendDown(*failing), HeldMover(), app)
        h = Harness(app, dedup=dedup, concurrency=1)
        h.feed(keyed(h, 0, "a"))
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.SUCCEEDED, "a store failure failed the job's run"

    run(main)
    assert ran == [0]
    assert "backend down" in caplog.text
