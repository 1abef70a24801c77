"""Delivery reports: the job a failed delivery names, told without anything but its bytes."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

from pipeline import EnqueueError, Job, KafkaUnavailableError, Pipeline, Settings
from pipeline._avro import HEADER_SIZE
from pipeline._codec import JobCodec
from pipeline._delivery import job_id_of
from pipeline._envelopes import EnvelopeFraming
from pipeline._producer import DeliveryCallback
from pipeline._schemaregistry import frame
from pipeline.testing import InMemoryTransport


class _RegistryGoneAfterRegistering:
    """A registry client that registered the envelope's schema, then became unreachable."""

    def __init__(self) -> None:
        self.lookups = 0

    def register_schema(self, subject: str, schema: Any) -> int:
        return 7

    def get_schema(self, schema_id: int) -> Any:
        self.lookups += 1
        raise ConnectionError("registry unreachable")

    def close(self) -> None:
        pass


def _never_wait(seconds: float) -> None:
    raise AssertionError(f"a delivery report waited {seconds}s for the schema registry")


def test_a_failed_delivery_names_its_job_without_asking_the_schema_registry() -> None:
    # Kafka and the registry unreachable at once (the producer's network is down): the delivery
    # report looked the envelope's writer schema up to find the job's id, and a reader waits
    # for the registry for good, so flush() (and the exit flush) hung instead of raising.
    settings = Settings(
        namespace="acme", schema_registry={"url": "http://registry.invalid", "envelope": True}
    )
    app = Pipeline(settings, transport=InMemoryTransport(fail_with=KafkaError._MSG_TIMED_OUT))
    framing = app.codec.framing
    assert isinstance(framing, EnvelopeFraming)
    client = _RegistryGoneAfterRegistering()
    framing.registry.client = client  # type: ignore[assignment]
    framing.registry._sleep = _never_wait
    job_id = app.enqueue("t", {"n": 1})
    with pytest.raises(KafkaUnavailableError, match=f"job {job_id} was not acknowledged"):
        app.flush()
    assert client.lookups == 0


@pytest.mark.parametrize("framed", [False, True], ids=["single-object", "registry"])
def test_the_job_id_is_read_from_the_envelope_of_either_framing(framed: bool) -> None:
    value = JobCodec().encode(Job(id="an id of any length", type="t", payload=b"{}"))
    if framed:  # what EnvelopeFraming writes: the registry's frame, then the same body
        value = frame(7, value[HEADER_SIZE:])
    assert job_id_of(value) == "an id of any length"


@pytest.mark.parametrize(
    "value",
    [b"", b"\xc3\x01", b"\xc3\x01" + bytes(8), b"\xc3\x01" + bytes(8) + b"\x7f", b"\x00\x01", b"x"],
)
def test_bytes_that_are_no_job_name_no_id(value: bytes) -> None:
    assert job_id_of(value) == "<unknown>"


REFUSED = KafkaError.TOPIC_AUTHORIZATION_FAILED


class _DeliversAtOnce(InMemoryTransport):
    """Serves the delivery report while ``produce`` is still running, as a ``flush`` in another
    thread can."""

    def produce(
        self, topic: str, value: bytes, key: bytes | None, on_delivery: DeliveryCallback
    ) -> None:
        super().produce(topic, value, key, on_delivery)
        self.poll()


def test_a_submitted_job_whose_report_comes_during_produce_is_named_by_it() -> None:
    app = Pipeline(Settings(namespace="acme"), transport=_DeliversAtOnce(fail_with=REFUSED))
    handle = app.submit("t", {"n": 1})
    assert handle.done()
    with pytest.raises(EnqueueError) as caught:
        handle.wait()
    assert handle.job_id
    assert caught.value.job_id == handle.job_id


def test_a_submitted_job_whose_report_the_periodic_poll_serves_is_named_by_it() -> None:
    # Every thousandth send serves the delivery reports: the thousandth is the submitted job.
    app = Pipeline(Settings(namespace="acme"), transport=InMemoryTransport(fail_with=REFUSED))
    for n in range(999):
        app.enqueue("t", {"n": n})
    handle = app.submit("t", {"n": 999})
    assert handle.done()
    with pytest.raises(EnqueueError) as caught:
        handle.wait()
    assert caught.value.job_id == handle.job_id != ""


class _KafkaDown(InMemoryTransport):
    """Acknowledges nothing, and counts two pending events (a broker-down error, a log line)
    in what ``flush`` says is left, as librdkafka's queue length does."""

    EVENTS = 2

    def __init__(self, deliver: bool = False) -> None:
        super().__init__()
        self.deliver = deliver

    def flush(self, timeout: float) -> int:
        if self.deliver:
            self.poll()
        return len(self._pending) + self.EVENTS


def test_a_flush_that_times_out_counts_the_jobs_not_the_events_in_the_queue() -> None:
    app = Pipeline(Settings(namespace="acme"), transport=_KafkaDown())
    for n in range(11):
        app.enqueue("t", {"n": n})
    app.submit("t", {"n": 11})
    app.enqueue_many("t", [{"n": 12}, {"n": 13}])
    with pytest.raises(KafkaUnavailableError, match=r"^14 job\(s\) were not acknowledged"):
        app.flush(timeout=0.5)


def test_a_flush_whose_jobs_were_all_acknowledged_raises_nothing_for_events_left() -> None:
    transport = _KafkaDown(deliver=True)
    app = Pipeline(Settings(namespace="acme"), transport=transport)
    ids = [app.enqueue("t", {"n": n}) for n in range(11)]
    app.flush(timeout=0.5)
    assert [job.id for job in transport.jobs("acme.jobs.default")] == ids
