"""Realistic dead letters in bulk, for the benchmarks of what reads ``<ns>.dlq``.

:func:`fill_dead_letters` writes N dead letters to a namespace the way workers do (encoded with
the library's codec, keyed by job id, in Kafka transactions), many thousands a second, so that
a benchmark can start from a deep DLQ without running jobs until they die. Each letter is built
by :func:`realistic_letter`: one of a dozen job types, a reason spread as in production (mostly
``max_attempts``), a ~300-byte JSON payload, one attempt error per failed attempt, a ~2 KB
traceback of its own, one of 40 tenants, and a ``dead_at`` spread over the last 14 days.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from confluent_kafka import Producer

from pipeline import Settings
from pipeline._codec import DeadLetterCodec
from pipeline._job import AttemptError, Job, Priority, now_ms
from pipeline._producer import producer_config
from pipeline._records import DeadLetter
from pipeline._topics import TopicNames

DAY_MS = 86_400_000
SPREAD_MS = 14 * DAY_MS
TENANTS = tuple(f"tenant-{n:02d}" for n in range(40))
TRACEBACK_BYTES = 2048
PAYLOAD_BYTES = 300


@dataclass(frozen=True)
class Failure:
    """How jobs of one type die: the error class, its message (``{n}`` is the job's number)."""

    error_class: str
    message: str


TYPES: dict[str, tuple[Failure, ...]] = {
    "email.send": (
        Failure("builtins.TimeoutError", "smtp timed out after 30s"),
        Failure("smtplib.SMTPServerDisconnected", "Connection unexpectedly closed"),
    ),
    "email.digest": (Failure("builtins.TimeoutError", "smtp timed out after 30s"),),
    "report.build": (Failure("builtins.ValueError", "bad report layout in section {n}"),),
    "report.export": (Failure("botocore.exceptions.ClientError", "AccessDenied on put_object"),),
    "billing.charge": (
        Failure("stripe.error.CardError", "card declined for customer cus_{n}"),
        Failure("requests.exceptions.ConnectionError", "connection reset by peer"),
    ),
    "billing.refund": (Failure("stripe.error.InvalidRequestError", "charge ch_{n} refunded"),),
    "image.resize": (Failure("PIL.UnidentifiedImageError", "cannot identify image file"),),
    "image.thumbnail": (Failure("builtins.MemoryError", "out of memory at 4096x4096"),),
    "webhook.deliver": (
        Failure("httpx.HTTPStatusError", "Server error '503 Service Unavailable'"),
        Failure("httpx.ConnectTimeout", "timed out connecting to hooks.example.com"),
    ),
    "search.index": (Failure("elasticsearch.ConflictError", "version conflict on doc {n}"),),
    "sync.crm": (Failure("requests.exceptions.HTTPError", "429 Too Many Requests"),),
    "notify.push": (Failure("firebase_admin.exceptions.NotFoundError", "token {n} expired"),),
}
# (reason, attempts it died after, weight): most jobs die after their retries run out.
REASONS = (
    ("max_attempts", 5, 70),
    ("fatal_error", 1, 15),
    ("timeout", 3, 8),
    ("validation_error", 1, 5),
    ("poison_pill", 1, 2),
)


def _traceback(job_type: str, failure: Failure, message: str, n: int) -> str:
    """A traceback of about :data:`TRACEBACK_BYTES`, its last lines naming this job."""
    module = job_type.replace(".", "/")
    frames = [
        f'  File "/app/handlers/{module}.py", line {40 + depth * 7}, in step_{depth}\n'
        f"    result = client.call(request, retries={depth}, job={n})\n"
        for depth in range(40)
    ]
    head = "Traceback (most recent call last):\n"
    tail = f"{failure.error_class}: {message}\n"
    body = "".join(frames)
    room = TRACEBACK_BYTES - len(head) - len(tail)
    return head + body[len(body) - room :] + tail


def realistic_letter(n: int, namespace: str, *, now: int, rng: random.Random) -> DeadLetter:
    """Dead letter number ``n`` of a benchmark namespace (see the module's docstring)."""
    job_type = rng.choice(list(TYPES))
    failure = rng.choice(TYPES[job_type])
    reason, attempts, _ = rng.choices(REASONS, weights=[w for *_, w in REASONS])[0]
    message = failure.message.format(n=n)
    dead_at = now - SPREAD_MS + rng.randrange(SPREAD_MS)
    errors = [
        AttemptError(
            attempt=a,
            at=dead_at - (attempts - a) * 60_000,
            error_class=failure.error_class,
            message=message,
            retryable=reason != "fatal_error",
            traceback_digest=f"{hash((job_type, failure)) & 0xFFFFFFFFFFFF:012x}",
            worker=f"worker-{rng.randrange(8)}@host-{rng.randrange(4)}",
        )
        for a in range(1, attempts + 1)
    ]
    filler = "x" * PAYLOAD_BYTES
    payload = json.dumps({"n": n, "customer": f"cus_{n}", "note": filler})
    job = Job(
        id=f"{now:012x}{n:020x}",
        type=job_type,
        payload=payload[: PAYLOAD_BYTES - 2].encode() + b'"}',
        priority=rng.choice((Priority.DEFAULT, Priority.DEFAULT, Priority.HIGH, Priority.LOW)),
        attempt=attempts,
        max_attempts=5,
        created_at=dead_at - attempts * 60_000,
        tenant=rng.choice(TENANTS),
        headers={"traceparent": f"00-{n:032x}-{n:016x}-01"},
        errors=errors,
    )
    return DeadLetter(
        id=f"d{now:011x}{n:020x}",
        reason=reason,
        message=message,
        error_class=failure.error_class,
        source_topic=TopicNames(namespace).jobs(job.priority),
        source_partition=n % 6,
        source_offset=n,
        job=job,
        raw_key=job.id.encode(),
        dead_at=dead_at,
        traceback=_traceback(job_type, failure, message, n),
    )


def fill_dead_letters(
    settings: Settings,
    count: int,
    *,
    first: int = 0,
    seed: int = 0,
    per_transaction: int = 5_000,
    now: int | None = None,
    timeout: float = 120.0,
) -> int:
    """Write ``count`` realistic dead letters (numbers ``first`` on) to ``<ns>.dlq`` in
    transactions of ``per_transaction``, as workers write them; returns ``count``. The topics
    must exist. The same ``seed``, ``first`` and ``now`` give the same letters."""
    rng = random.Random(seed * 1_000_003 + first)
    stamp = now_ms() if now is None else now
    codec = DeadLetterCodec()
    topic = TopicNames(settings.namespace).dlq
    conf = producer_config(settings, bulk=True)
    conf["transactional.id"] = f"{settings.namespace}.bench-dlq-filler"
    producer = Producer(conf)
    try:
        producer.init_transactions(timeout)
        for start in range(first, first + count, per_transaction):
            producer.begin_transaction()
            for n in range(start, min(start + per_transaction, first + count)):
                letter = realistic_letter(n, settings.namespace, now=stamp, rng=rng)
                _produce(producer, topic, codec.encode(letter), letter.job_id)
            producer.commit_transaction(timeout)
    finally:
        producer.flush(timeout)
    return count


def _produce(producer: Producer, topic: str, value: bytes, job_id: str | None) -> None:
    key = job_id.encode() if job_id else None
    while True:
        try:
            producer.produce(topic, value, key)
            return
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.1)
