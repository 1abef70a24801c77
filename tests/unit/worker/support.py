"""Small builders for the worker's unit tests (no Kafka)."""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from confluent_kafka import Message

from pipeline import DecodeError, Job, JobType, Pipeline, Priority
from pipeline._job import PayloadEncoding
from pipeline._workersettings import WorkerSettings
from pipeline_worker import Middleware, Outcome, OutcomeKind
from pipeline_worker._metrics import TypeStats, WorkerMetrics
from pipeline_worker._work import PartitionState, Work
from pipeline_worker.dispatch.limits import TypeLimit
from pipeline_worker.execute.processor import Processor

PRIORITIES = list(Priority)


def noop(**_: Any) -> None:
    return None


def state(pidx: int = 0, partition: int = 0, topic: str | None = None) -> PartitionState:
    priority = PRIORITIES[pidx]
    return PartitionState(topic or f"t.jobs.{priority.value}", partition, priority, pidx)


class Jobs:
    """Makes Work items with increasing offsets per partition."""

    def __init__(self) -> None:
        self._offsets: dict[PartitionState, int] = {}
        self._types: dict[str, JobType] = {}

    def work(
        self,
        partition: PartitionState,
        job_type: str = "t",
        *,
        key: bytes | None = None,
        limit: TypeLimit[Work] | None = None,
        handler: Callable[..., Any] = noop,
    ) -> Work:
        offset = self._offsets.get(partition, 0)
        self._offsets[partition] = offset + 1
        jt = self._types.get(job_type)
        if jt is None:
            jt = self._types[job_type] = JobType(job_type, handler)
        job = Job(
            id=f"{partition.topic}-{partition.partition}-{offset}", type=job_type, payload=b"{}"
        )
        partition.tracker.add(offset)
        return Work(partition, offset, key, job, jt, limit, TypeStats(job_type, "default"))


class FakeTimers:
    """A manual clock and scheduler for the dispatcher's rate-limit timers."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def clock(self) -> float:
        return self.now

    def schedule(self, delay: float, callback: Callable[[], None]) -> object:
        self.timers.append((self.now + delay, callback))
        return None

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, callback in sorted(due, key=lambda t: t[0]):
            callback()


class JsonJobCodec:
    """A stand-in for the Avro envelope codec: these tests are about the worker, not the wire."""

    def encode(self, job: Job) -> bytes:
        return json.dumps(
            {
                "id": job.id,
                "type": job.type,
                "payload": job.payload.decode("latin-1"),
                "payload_encoding": job.payload_encoding.value,
                "attempt": job.attempt,
                "idempotency_key": job.idempotency_key,
                "tenant": job.tenant,
                "not_before": job.not_before,
            }
        ).encode()

    def decode(self, data: bytes) -> Job:
        if data == b"crash":
            raise RuntimeError("a bug in the codec")
        try:
            raw = json.loads(data)
            return Job(
                id=raw["id"],
                type=raw["type"],
                payload=raw["payload"].encode("latin-1"),
                payload_encoding=PayloadEncoding(raw.get("payload_encoding", "JSON")),
                attempt=raw["attempt"],
                idempotency_key=raw.get("idempotency_key"),
                tenant=raw.get("tenant"),
                not_before=raw.get("not_before"),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise DecodeError(f"not a job: {exc}", bytes(data)) from exc


class Recorder(Middleware):
    """Keeps every outcome; ``wait_for(n)`` returns once ``n`` arrived."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self._changed = asyncio.Event()

    def on_outcome(self, outcome: Outcome) -> Awaitable[None] | None:
        self.outcomes.append(outcome)
        self._changed.set()
        return None

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[Outcome]:
        async def enough() -> None:
            while len(self.outcomes) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(enough(), timeout)
        return self.outcomes

    def kinds(self) -> list[OutcomeKind]:
        return [o.kind for o in self.outcomes]


class Harness:
    """A Processor on the running loop, fed with Kafka messages built in memory."""

    def __init__(
        self,
        app: Pipeline,
        *,
        middleware: Sequence[Middleware] = (),
        router: Any = None,
        dedup: Any = None,
        plain: bool = False,
        **worker: Any,
    ) -> None:
        """``plain``: no middleware at all, not even the recorder (the inlined success path);
        wait on ``processor.finished`` then."""
        self.app = app
        app.codec = JsonJobCodec()  # type: ignore[assignment]
        self.recorder = Recorder()
        self.metrics = WorkerMetrics()
        self.processor = Processor(
            app=app,
            worker=WorkerSettings(**worker),
            priorities=PRIORITIES,
            topics={p: app.topics.jobs(p) for p in PRIORITIES},
            loop=asyncio.get_running_loop(),
            metrics=self.metrics,
            middleware=[] if plain else [self.recorder, *middleware],
            context=contextvars.copy_context(),
            router=router,
            dedup=dedup,
        )
        self.partition = state(2, topic=app.topics.jobs("default"))
        self._next = 0

    def message(
        self,
        job_type: str,
        payload: dict[str, Any] | None = None,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        offset: int | None = None,
        tenant: str | None = None,
        not_before: int | None = None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> Message:
        if offset is None:
            offset = self._next
        self._next = max(self._next, offset + 1)
        if value is None:
            job = Job(
                id=f"job-{offset}",
                type=job_type,
                payload=json.dumps(payload or {}).encode(),
                tenant=tenant,
                not_before=not_before,
            )
            value = self.app.codec.encode(job)
        return Message(
            topic=self.partition.topic,
            partition=0,
            offset=offset,
            key=key,
            value=value,
            headers=headers,
        )

    def feed(self, *messages: Message) -> None:
        self.partition.handed += len(messages)
        self.processor.on_batch([(self.partition, list(messages))])
