"""``enqueue_many``: the jobs of one route validated, encoded and handed to the producer in
batches, each refused payload named by its place in the batch."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from ._errors import PayloadValidationError
from ._failurelog import FailureLog
from ._followups import Followed, FollowUps, Poll, produce_followed
from ._job import new_job_id, now_ms
from ._jobtemplate import JobTemplate
from ._messagesize import enqueue_room, too_large
from ._route import Route
from ._transport import DeliveryCallback, Transport, taken_of, tell_taken, tells_taken

__all__ = ["BATCH", "send_many"]

BATCH = 1000
"""Jobs encoded before they are handed to the producer together."""


def send_many(
    transport: Transport,
    route: Route,
    template: JobTemplate,
    payloads: Iterable[Mapping[str, Any]],
    *,
    log: FailureLog,
    max_bytes: int,
    follow: tuple[FollowUps, Poll, float] | None = None,
) -> list[str]:
    """Send a job of ``route`` (encoded by ``template``) per payload; return their ids.
    ``log`` counts them and serves their delivery reports; ``follow``: the follow-ups of the
    running job that enqueues them, what serves their reports and how long the producer may
    take to (see :mod:`._followups`).

    A payload that fails validation, or a job larger than a producer sending ``max_bytes``
    takes, raises :class:`PayloadValidationError` naming its index and carrying the ids of the
    jobs before it (:meth:`~PayloadValidationError.in_batch`): those are sent, as one enqueue
    each would have sent them; it and the ones after it are not. Any other exception (the
    iterable of payloads raising, a producer failing) is raised as it is, with the ids of the
    jobs sent before it attached (:func:`_tell_sent`).
    """
    produce_many = getattr(transport, "produce_many", None)
    whole = produce_many is None or getattr(transport, "tells_taken", False) is True
    if produce_many is None:  # a transport without it gets one produce() per job
        produce_many = partial(_produce_each, transport.produce)
    topic, key = route.topic, route.key
    room = enqueue_room(max_bytes, key)
    encode, make_id, checked = template.encode, new_job_id.at, route.payload_bytes
    # Nothing to check but what the codec checks itself (a mapping, encodable): call it alone.
    codec_only = route.registered is None and route.check is None
    codec, job_type = route.payload_codec.encode, route.job_type
    ids: list[str] = []
    values: list[bytes] = []
    sent = 0  # ids[:sent] are the producer's; a hand-over that raised leaves its jobs out
    unsure = 0  # jobs of a hand-over that raised without saying how many it took

    def hand_over() -> None:
        nonlocal values, sent, unsure
        batch, values = values, []  # handed over: never sent twice, whatever fails
        try:
            _hand_over(produce_many, topic, batch, key, log=log, follow=follow, whole=whole)
        except BaseException as exc:
            taken = taken_of(exc, len(batch))  # the producer may have taken some of them
            sent += taken
            unsure = 0 if tells_taken(exc) else len(batch) - taken
            raise
        sent += len(batch)

    try:
        try:
            for payload in payloads:
                created_at = now_ms()
                job_id = make_id(created_at)
                data = codec(job_type, payload) if codec_only else checked(payload)
                value = encode(job_id, data, created_at)
                if len(value) > room:
                    raise too_large(job_type, len(value) + len(key or b""), max_bytes)
                values.append(value)
                ids.append(job_id)
                if len(values) == BATCH:
                    hand_over()
                    transport.poll(0)  # serve delivery callbacks so they never pile up
        finally:
            # The jobs before a payload that failed (or before the payloads' iterable raised)
            # are sent, as one by one would.
            if values:
                hand_over()
    except PayloadValidationError as exc:
        raise exc.in_batch(len(ids), ids) from exc.__cause__
    except BaseException as exc:
        _tell_sent(exc, ids[:sent], unsure)
        raise
    return ids


def _hand_over(
    produce_many: Callable[[str, list[bytes], bytes | None, DeliveryCallback], None],
    topic: str,
    batch: list[bytes],
    key: bytes | None,
    *,
    log: FailureLog,
    follow: tuple[FollowUps, Poll, float] | None,
    whole: bool,
) -> None:
    """Hand ``batch`` to ``produce_many``, counted in ``log`` (as the follow-ups of a running
    job with ``follow``); an exception tells how many were taken before it."""
    generation = log.sending(len(batch))
    on_delivery = generation.on_delivery()
    try:
        if follow is None:
            produce_many(topic, batch, key, on_delivery)
        else:
            follow_ups, poll, patience_s = follow
            followed = partial(log.followed, generation)
            _produce_followed(
                partial(produce_many, topic), batch, key, on_delivery,
                (follow_ups, followed, poll, patience_s), whole=whole,
            )  # fmt: skip
    except BaseException as exc:
        log.not_sent(generation, len(batch) - taken_of(exc, len(batch)))
        raise


def _tell_sent(exc: BaseException, enqueued_ids: list[str], unsure: int) -> None:
    """Attach to ``exc``, whatever its type, the ids of the jobs sent before it was raised
    (``enqueued_ids``, as :class:`PayloadValidationError` has them) and a note that counts
    them: without them a caller cannot tell what to send again without duplicates.
    ``unsure``: jobs handed to a producer that raised, some of which it may have sent."""
    with contextlib.suppress(AttributeError):  # an exception that takes no attribute
        exc.enqueued_ids = enqueued_ids  # type: ignore[attr-defined]
    unsure_part = (
        f"; of the {unsure} after them, handed to a producer as it raised, some may have been"
        if unsure
        else ""
    )
    exc.add_note(
        f"enqueue_many sent the {len(enqueued_ids)} job(s) of the batch before this error "
        f"(their ids are its enqueued_ids){unsure_part}; no later payload was sent"
    )


def _produce_followed(
    produce_many: Callable[[list[bytes], bytes | None, DeliveryCallback], None],
    batch: list[bytes],
    key: bytes | None,
    on_delivery: DeliveryCallback,
    follow: tuple[FollowUps, Followed, Poll, float],
    *,
    whole: bool,
) -> None:
    """Hand ``batch`` to ``produce_many`` as the follow-ups of a running job, which counts each
    one the producer took: in one call when ``whole`` (the producer says how many of them it
    took before it raised: :func:`~._transport.tell_taken`), else one job a call. An exception
    tells how many were taken before it."""
    follow_ups, followed, poll, patience_s = follow
    taken = 0
    try:
        for part in (batch,) if whole else ([value] for value in batch):
            produce_followed(
                follow_ups, len(part), partial(produce_many, part, key), plain=on_delivery,
                followed=followed, poll=poll, patience_s=patience_s,
            )  # fmt: skip
            taken += len(part)
    except BaseException as exc:
        tell_taken(exc, taken + taken_of(exc, len(batch) - taken))
        raise


def _produce_each(
    produce: Callable[[str, bytes, bytes | None, DeliveryCallback], None],
    topic: str,
    values: list[bytes],
    key: bytes | None,
    on_delivery: DeliveryCallback,
) -> None:
    """One ``produce`` per value; an exception tells how many were taken before it."""
    taken = 0
    try:
        for value in values:
            produce(topic, value, key, on_delivery)
            taken += 1
    except BaseException as exc:
        tell_taken(exc, taken)
        raise
