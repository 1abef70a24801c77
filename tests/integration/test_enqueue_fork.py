"""An application used on both sides of ``os.fork()``: each process's jobs reach Kafka.

librdkafka's threads do not survive a fork, so a producer made before it can queue jobs in the
child but never send them. Each script runs in its own interpreter, as a user's would.
"""

from __future__ import annotations

import pytest

from pipeline import Settings
from pipeline._admin import apply_topics

from .test_exit_flush import assert_every_job_reached_kafka

pytestmark = pytest.mark.kafka

# The parent's producer exists (and holds a job) when it forks; the child enqueues and flushes.
ENQUEUE_IN_A_FORKED_CHILD = """
    import os, sys
    from pipeline import Pipeline

    app = Pipeline(producer={"delivery_timeout_s": 10, "exit_flush_timeout_s": 10})
    print(app.enqueue("report.build", {"n": 1}), flush=True)
    app.flush()
    print(app.enqueue("report.build", {"n": 2}), flush=True)
    pid = os.fork()
    if pid == 0:
        print(app.enqueue("report.build", {"n": 3}), flush=True)
        try:
            app.flush(timeout=10)
        except Exception as exc:
            print("child:", exc, file=sys.stderr, flush=True)
            os._exit(1)
        sys.exit(0)  # a normal exit: the exit flush runs in the child too
    _, status = os.waitpid(pid, 0)
    app.flush()
    sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_enqueues_with_a_producer_of_its_own(settings: Settings) -> None:
    apply_topics(settings)
    # The child does not report the parent's queued job as lost either: the parent sends it.
    assert_every_job_reached_kafka(settings, ENQUEUE_IN_A_FORKED_CHILD, 3)
