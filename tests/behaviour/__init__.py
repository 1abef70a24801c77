"""The behaviour suite: one set of scenarios, run against the stub worker and a real worker.

Each scenario in ``test_behaviour.py`` takes the ``harness`` fixture and runs once per harness:

* ``stub``: the stub worker of ``pipeline.testing`` (from its pytest plugin's
  ``pipeline_stub`` fixture) draining the application's enqueues on a fake clock, in the test
  process;
* ``kafka``: a real ``pipeline-worker`` process (and a ``pipeline-scheduler`` for delayed jobs)
  on the test session's Kafka, one of each for the whole module, in a namespace of their own.

Both run the same application (:mod:`.app`) and are held to the same assertions: how each job
ended (succeeded with its handler's value, or dead-lettered with its reason), at which attempt,
and the handler calls the application recorded (order, attempts, times). So what users learn
from the stub in their own tests is what the real worker does: retries with ``Retry`` and
backoff, ``max_attempts``, fatal errors, unknown job types, messages that are not jobs,
payload validation, time limits, delays, a key's partition and order, priorities, idempotency
keys and jobs enqueued by handlers. A scenario that would need different expectations on the
two sides is a bug in one of them, never a branch in the test.

The real worker runs with ``--key-ordering`` and ``--policy strict``: the stub runs one job at
a time and always takes the highest priority's due job, which is what those options promise
(the worker's default policy, ``weighted``, lets lower priorities take a share of a backlog).
Times of handler calls are read on each side's clock; the stub's fake clock stands still while
a handler runs, so durations (the time limit) are measured on the wall clock on both sides.

Outcomes on Kafka come from what the worker writes (``succeeded`` events on ``<ns>.events``,
dead letters on ``<ns>.dlq``), polled with deadlines; no scenario waits a fixed time. The ``kafka``
cases carry the ``kafka`` mark; ``pytest -m "not kafka" tests/behaviour`` runs the stub alone.
"""
