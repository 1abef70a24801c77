"""``python -m ops.bench``: throughput and latency of the pipeline next to raw confluent-kafka.

Every section measures the pipeline and its raw baseline in the same run, on the same broker
and machine, and reports the ratio; the results go to ``docs/benchmarks.md``. The benchmark
reports, it never asserts.
"""
