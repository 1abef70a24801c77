"""An application used on both sides of a fork: each process's jobs reach Kafka, or it says so.

librdkafka's threads do not survive a fork, so a producer made before it can queue jobs in the
child but never send them. Each script runs in its own interpreter, as a user's would.
"""

from __future__ import annotations

import pytest

from pipeline import Settings
from pipeline._admin import apply_topics

from .test_exit_flush import NOWHERE, _run, assert_every_job_reached_kafka

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


# multiprocessing ends its forked children with os._exit(), which runs no atexit function: the
# jobs a child enqueued without flush() were dropped with no word. A Process and a Pool's workers.
ENQUEUE_IN_MULTIPROCESSING_CHILDREN = """
    import multiprocessing, os, sys
    from pipeline import Pipeline

    app = Pipeline(producer={"delivery_timeout_s": 10, "exit_flush_timeout_s": 10})

    def work(n):
        # One write a line: the pool's two children print at the same time, and print()
        # writes the id and its newline apart.
        os.write(1, (app.enqueue("report.build", {"n": n}) + "\\n").encode())

    context = multiprocessing.get_context("fork")
    child = context.Process(target=work, args=(1,))
    child.start()
    child.join()
    pool = context.Pool(2)
    pool.map(work, [2, 3])
    pool.close()
    pool.join()
    sys.exit(child.exitcode)
"""


def test_jobs_a_multiprocessing_child_enqueued_without_flush_reach_kafka(
    settings: Settings,
) -> None:
    apply_topics(settings)
    assert_every_job_reached_kafka(settings, ENQUEUE_IN_MULTIPROCESSING_CHILDREN, 3)


def test_jobs_a_multiprocessing_child_lost_are_reported(namespace: str) -> None:
    script = """
        import multiprocessing
        from pipeline import Pipeline

        app = Pipeline(producer={"delivery_timeout_s": 1, "exit_flush_timeout_s": 10})

        def work():
            print(app.enqueue("report.build", {"n": 1}), flush=True)

        child = multiprocessing.get_context("fork").Process(target=work)
        child.start()
        child.join()
    """
    result = _run(script, NOWHERE, namespace)
    [job_id] = result.stdout.split()
    [report] = [line for line in result.stderr.splitlines() if "never reached Kafka" in line]
    assert job_id in report


def test_a_child_does_not_report_the_jobs_its_parent_lost(namespace: str) -> None:
    # A failure the parent had not reported yet when it forked was reported again by every
    # child at its exit, as if the child had lost that job too.
    script = """
        import multiprocessing, os, sys
        from pipeline import Pipeline

        app = Pipeline(producer={"delivery_timeout_s": 1, "exit_flush_timeout_s": 5})
        print(app.enqueue("report.build", {"n": 1}), flush=True)
        app._transport.flush(10)  # its delivery failed: nobody was told yet
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # a normal exit: the exit flush runs in the child
        os.waitpid(pid, 0)
        child = multiprocessing.get_context("fork").Process(target=print, args=("",))
        child.start()
        child.join()
    """
    result = _run(script, NOWHERE, namespace)
    [job_id] = result.stdout.split()
    reports = [line for line in result.stderr.splitlines() if "never reached Kafka" in line]
    assert len(reports) == 1, result.stderr
    assert job_id in reports[0]


def test_forked_children_exit_while_the_parents_producers_are_busy(namespace: str) -> None:
    # At a child's exit the interpreter freed the parent's producers, whose destruction takes
    # locks of the parent's librdkafka threads and waits for those threads: the child crashed
    # (SIGSEGV) or hung for good when it had forked while one of them held a lock (often, as they
    # try to reach Kafka). Each child must end by itself with status 0; one that hangs is killed
    # after 10 s (SIGKILL, status -9), which fails the test without hanging it.
    script = """
        import os, select, signal, sys
        from pipeline import Pipeline

        app = Pipeline(producer={"delivery_timeout_s": 1, "exit_flush_timeout_s": 0})
        app.enqueue("report.build", {"n": 1})
        app.enqueue_many("report.build", [{"n": 2}])
        app._transport.flush(10)  # both fail: the producers go on trying to reach Kafka
        for _ in range(10):
            pid = os.fork()
            if pid == 0:
                sys.exit(0)  # a normal exit: the interpreter's finalization runs
            exited = os.pidfd_open(pid)  # readable once the child has exited
            if not select.select([exited], [], [], 10)[0]:
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            os.close(exited)
            print(os.waitstatus_to_exitcode(status))
    """
    result = _run(script, NOWHERE, namespace)
    statuses = [int(status) for status in result.stdout.split()]
    assert statuses == [0] * 10, result.stderr
