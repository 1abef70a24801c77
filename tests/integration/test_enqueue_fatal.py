"""A producer that fails for good, against a real Kafka: the application replaces it.

The idempotent producer's fatal errors come from broker answers no test can order (a sequence
the broker lost, an epoch fenced), so librdkafka has a hook for them:
``rd_kafka_test_fatal_error`` raises a fatal error in a running producer exactly as a real one
is raised (its queue purged, the error handed to the application, ``produce`` refused from then
on). confluent-kafka does not expose it; it is called here on the producer's handle.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path

import confluent_kafka
from confluent_kafka import KafkaError, Producer

from pipeline import Pipeline, Settings
from pipeline._admin import apply_topics
from pipeline._errors import ProducerFatalError
from pipeline._producer import KafkaTransport
from tests.integration.test_enqueue import read_all

RD_KAFKA_PRODUCER = 0


def _librdkafka() -> ctypes.CDLL:
    """The librdkafka confluent-kafka runs on: the copy its wheel bundles, else the system's."""
    bundled = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    found = sorted(bundled.glob("librdkafka*.so*"))
    name = str(found[0]) if found else ctypes.util.find_library("rdkafka")
    assert name, "found no librdkafka next to confluent-kafka nor on the system"
    lib = ctypes.CDLL(name)
    lib.rd_kafka_test_fatal_error.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
    lib.rd_kafka_test_fatal_error.restype = ctypes.c_int
    lib.rd_kafka_type.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_outq_len.argtypes = [ctypes.c_void_p]
    return lib


def fail_for_good(producer: Producer, code: int, reason: str) -> None:
    """Make ``producer`` fail for good with ``code``, through librdkafka's own fatal path."""
    lib = _librdkafka()
    # confluent-kafka's handle object: the object header, then the rd_kafka_t pointer.
    handle = ctypes.c_void_p.from_address(id(producer) + object.__basicsize__).value
    assert lib.rd_kafka_type(handle) == RD_KAFKA_PRODUCER
    assert lib.rd_kafka_outq_len(handle) == len(producer)
    assert lib.rd_kafka_test_fatal_error(handle, code, reason.encode()) == 0


def test_after_a_fatal_error_the_next_jobs_reach_kafka_on_a_new_producer(
    settings: Settings, bootstrap_servers: str
) -> None:
    apply_topics(settings)
    # Jobs linger a second in the producer's queue: some are held when it fails.
    lingering = settings.producer.model_copy(update={"linger_ms": 1000})
    app = Pipeline(settings.model_copy(update={"producer": lingering}))
    transport = app._transport
    assert isinstance(transport, KafkaTransport)
    try:
        before = app.submit("t", {"n": 0}).wait(timeout=30)
        failed = transport._producer
        assert failed is not None
        held = [app.enqueue("t", {"n": n}) for n in range(1, 4)]
        fail_for_good(failed, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "provoked by the test")

        after = app.submit("t", {"n": 4}).wait(timeout=30)  # it was refused until a restart
        many = app.enqueue_many("t", ({"n": n} for n in range(5, 8)))
        assert transport._producer is not failed
        try:
            app.flush(timeout=30)
        except ProducerFatalError as caught:
            error = caught
        else:
            raise AssertionError("the held jobs' loss was not raised")
        assert error.job_id in held
        assert error.cause == "OUT_OF_ORDER_SEQUENCE_NUMBER: test_fatal_error: provoked by the test"
        assert "(and 2 more)" in str(error.__cause__)
        app.flush(timeout=30)  # told once
        assert not transport._retired  # the failed producer is released once it told everything

        messages = read_all(bootstrap_servers, app.topics.jobs("default"), 5)
        sent = sorted(app.codec.decode(m.value() or b"").id for m in messages)
        assert sent == sorted([before.job_id, after.job_id, *many])
    finally:
        app.close()
