"""The stub side: the suite's application drained by ``pipeline.testing.StubWorker``.

A fresh application per test and a stub worker from the test kit's pytest plugin
(``pipeline_stub``, on its ``pipeline_clock``), in the test process. Outcomes are the stub's
:class:`~pipeline.testing.JobResult` of each job's last run (or its report of the job as
deduplicated); the handler calls are the application's own recording, timed on the fake clock.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from pipeline import Pipeline
from pipeline.testing import JobStatus, StubWorker

from .app import recorder
from .harness import Harness, Outcome, Settled, Status, raw_name, read_calls

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

_STATUSES: dict[JobStatus, Status] = {JobStatus.SUCCEEDED: "succeeded", JobStatus.DEAD: "dead"}


class StubHarness(Harness):
    """The suite's application on the stub worker; see the module docstring."""

    name = "stub"

    def __init__(self, record: Path, worker: StubWorker) -> None:
        self.record = record
        self.worker = worker
        self.clock = worker.clock
        self.producer = worker.app
        self.foreign = Pipeline(self.producer.settings, transport=worker.transport)
        """A producer that knows no job type, writing where the stub reads."""
        self.outcomes: dict[str, Outcome] = {}
        self._raw: list[str] = []
        """Names of the messages :meth:`send_raw` wrote, not settled yet, in order."""

    @contextlib.contextmanager
    def recording(self) -> Iterator[StubHarness]:
        """The application's calls go to ``record``, timed on the stub's clock, in the block."""
        recorder.use(str(self.record), self.clock.now_ms)
        try:
            yield self
        finally:
            recorder.use(None)

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def send_raw(self, value: bytes) -> str:
        topic = self.producer.topics.jobs("default")
        self.worker.transport.produce(topic, value, None, lambda error, message: None)
        self._raw.append(raw_name(value))
        return self._raw[-1]

    def backlog(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()  # the stub runs nothing before settle()

    def settle(self, job_ids: Sequence[str], timeout_s: float = 30.0) -> Settled:
        report = self.worker.drain()
        for result in report.results:
            if result.job is None:  # not a job: the stub runs those in the order they came
                self.outcomes[self._raw.pop(0)] = Outcome("dead", str(result.reason), 0)
            elif result.status in _STATUSES:
                reason = str(result.reason) if result.reason is not None else None
                status = _STATUSES[result.status]
                self.outcomes[result.job.id] = Outcome(status, reason, result.attempt, result.value)
        for job in report.deduplicated:
            self.outcomes[job.id] = Outcome("deduplicated", None, job.attempt)
        unsettled = [job_id for job_id in job_ids if job_id not in self.outcomes]
        assert not unsettled, f"the stub left jobs unsettled: {unsettled}\n{report}"
        return Settled(
            {job_id: self.outcomes[job_id] for job_id in job_ids},
            read_calls(self.record, job_ids),
        )
