"""(a) Enqueue throughput: ``app.enqueue_many`` next to a raw confluent-kafka produce loop."""

from __future__ import annotations

import statistics
import time

from confluent_kafka import KafkaError, Message, Producer

from pipeline import Job, Pipeline, Priority
from pipeline._codec import JsonPayload
from pipeline._job import new_job_id
from pipeline._producer import producer_config

from .env import fresh_namespace, say
from .report import Measurement, Section, goal_line

JOB_TYPE = "bench.noop"


def _pipeline_run(app: Pipeline, jobs: int) -> float:
    began = time.perf_counter()
    app.enqueue_many(JOB_TYPE, ({"n": i} for i in range(jobs)))
    app.flush(120)
    return time.perf_counter() - began


def _raw_run(producer: Producer, topic: str, values: list[bytes]) -> float:
    errors: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            errors.append(error)

    began = time.perf_counter()
    for index, value in enumerate(values):
        while True:
            try:
                producer.produce(topic, value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.01)
        if index % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - began
    if remaining or errors:
        raise RuntimeError(f"raw producer: {remaining} unacknowledged, errors: {errors[:3]}")
    return elapsed


OLD_LINGER_MS = 5.0
"""The producer's ``linger.ms`` default before it became 0, measured next to the new one."""


def run(bootstrap_servers: str, jobs: int, repeats: int) -> Section:
    settings = fresh_namespace(bootstrap_servers, "enqueue")
    topic = f"{settings.namespace}.jobs.default"
    app = Pipeline(settings)
    _pipeline_run(app, 1000)  # warm-up: producer, metadata, connections
    # The defaults before: one producer for every enqueue, lingering 5 ms.
    old_producer = settings.producer.model_copy(
        update={"linger_ms": OLD_LINGER_MS, "bulk_linger_ms": OLD_LINGER_MS}
    )
    lingering = Pipeline(settings.model_copy(update={"producer": old_producer}))
    _pipeline_run(lingering, 1000)

    # The raw loop sends the very bytes enqueue_many makes: same jobs, encoded beforehand.
    payload = JsonPayload()
    codec = app.codec
    values = [
        codec.encode(
            Job(
                id=new_job_id(),
                type=JOB_TYPE,
                payload=payload.encode(JOB_TYPE, {"n": i}),
                priority=Priority.DEFAULT,
                max_attempts=settings.producer.default_max_attempts,
            )
        )
        for i in range(jobs)
    ]
    raw = Producer(producer_config(settings, bulk=True))  # enqueue_many's producer
    _raw_run(raw, topic, values[:1000])

    pipeline_runs: list[float] = []
    raw_runs: list[float] = []
    lingering_runs: list[float] = []
    for attempt in range(repeats):  # interleaved, so that all three see the same noise
        say(f"enqueue: run {attempt + 1}/{repeats}: {jobs:,} jobs with enqueue_many")
        pipeline_runs.append(_pipeline_run(app, jobs))
        say(f"enqueue: run {attempt + 1}/{repeats}: {jobs:,} jobs with a raw produce loop")
        raw_runs.append(_raw_run(raw, topic, values))
        say(f"enqueue: run {attempt + 1}/{repeats}: enqueue_many at linger.ms={OLD_LINGER_MS:g}")
        lingering_runs.append(_pipeline_run(lingering, jobs))
    pipeline_best, raw_best = statistics.median(pipeline_runs), statistics.median(raw_runs)
    app.close(60)
    lingering.close(60)
    raw.flush(60)

    baseline = Measurement(
        "raw confluent-kafka produce loop (pre-encoded values)",
        jobs,
        raw_best,
        "Producer(producer_config(settings, bulk=True)).produce(topic, value, on_delivery=cb); "
        "flush()",
    )
    measured = Measurement(
        "pipeline `app.enqueue_many` + `app.flush()`",
        jobs,
        pipeline_best,
        f'app.enqueue_many("{JOB_TYPE}", ({{"n": i}} for i in range({jobs}))); app.flush()',
    )
    old_default = Measurement(
        f"pipeline `app.enqueue_many` + `app.flush()`, the old defaults (one producer, "
        f"`linger.ms={OLD_LINGER_MS:g}`)",
        jobs,
        statistics.median(lingering_runs),
        f"the same, with PIPELINE_PRODUCER__LINGER_MS={OLD_LINGER_MS:g}",
    )
    ratio = measured.rate / baseline.rate
    versus_old = measured.rate / old_default.rate
    config = producer_config(settings, bulk=True)
    every_run = ", ".join(
        f"{jobs / p:,.0f} / {jobs / r:,.0f} / {jobs / o:,.0f}"
        for p, r, o in zip(pipeline_runs, raw_runs, lingering_runs, strict=True)
    )
    return Section(
        "(a) Enqueue throughput",
        f'{jobs:,} small jobs (`{{"n": i}}`, JSON payload, Avro envelope) from one process to '
        f"one topic of 6 partitions, median of {repeats} run(s) each, interleaved, timed until "
        "`flush()` "
        f"returned (every job acknowledged). Both use the same producer settings: "
        f"`enable.idempotence={config['enable.idempotence']}`, `acks={config['acks']}`, "
        f"`linger.ms={config['linger.ms']:g}`, `compression.type={config['compression.type']}`. "
        "The raw loop gets the already encoded bytes: the difference is the job model, "
        "validation, id generation and encoding. The third row is enqueue_many with the "
        f"producer's old defaults (one producer for single and bulk enqueues, "
        f"`linger.ms={OLD_LINGER_MS:g}`), on the same topic; the new defaults send single "
        f"enqueues at once (`linger.ms={settings.producer.linger_ms:g}`) and give "
        f"enqueue_many a producer of its own (`linger.ms={config['linger.ms']:g}`).",
        rows=[(baseline, None), (measured, baseline), (old_default, baseline)],
        extra=[
            f"Every run, in order (enqueue_many / raw / enqueue_many with the old defaults, "
            f"jobs/s): {every_run}. enqueue_many with the new defaults next to the old: "
            f"{versus_old:.0%}.",
        ],
        goal=goal_line(
            [
                (f"≥ 100,000 jobs/s ({measured.rate:,.0f})", measured.rate >= 100_000),
                (f"≥ 40% of raw ({ratio:.0%})", ratio >= 0.4),
                (f"≥ 50% of raw ({ratio:.0%})", ratio >= 0.5),
                (
                    f"≥ 90% of enqueue_many with the old defaults ({versus_old:.0%})",
                    versus_old >= 0.9,
                ),
            ],
        ),
    )
