"""``make run``: a local Kafka, the topics, example jobs, and a worker that runs them.

Uses the cluster named by ``PIPELINE_BOOTSTRAP_SERVERS`` when set; otherwise starts (or reuses)
the local dev broker on localhost:9092, which stays up afterwards (``pipeline dev down``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline import PipelineError, Settings
from pipeline._admin import apply_topics, describe_topics


def bootstrap_servers() -> tuple[str, str | None]:
    """The Kafka to use, and the command that stops it if this started (or reused) it."""
    servers = os.environ.get("PIPELINE_BOOTSTRAP_SERVERS")
    if servers:
        print(f"==> using Kafka at {servers}")
        return servers, None
    from pipeline_cli import devbroker
    from pipeline_cli._dev import stop_command

    print("==> starting a local Kafka (first run downloads the jars with Maven)")
    cluster = devbroker.up(progress=lambda line: print(f"    {line}"))
    return cluster.bootstrap_servers, stop_command(cluster.data_dir)


def main() -> int:
    try:
        servers, stop = bootstrap_servers()
        os.environ["PIPELINE_BOOTSTRAP_SERVERS"] = servers
        settings = Settings()
        print(f"==> topics of namespace {settings.namespace!r}")
        print(f"    {apply_topics(settings).summary()}")

        from examples.app import app, enqueue_examples

        print("==> enqueueing example jobs")
        ready = enqueue_examples()
        app.flush()
        print(
            f"    {ready} ready jobs on three priority topics, 1 delayed job on the deferred topic"
        )
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    print("==> running a worker until the topics are drained (pipeline-worker --burst)")
    worker = Path(sys.executable).with_name("pipeline-worker")
    code = subprocess.call([str(worker), "--app", "examples.app", "--burst", "--concurrency", "8"])
    if code != 0:
        print(f"error: the worker exited with {code}", file=sys.stderr)
        return code

    print("==> messages per topic (pipeline topics describe)")
    for topic in describe_topics(settings):
        if topic.messages:
            print(f"    {topic.name:<28} {topic.messages:>5}")
    print("==> the backlog, the workers and the scheduler (pipeline status)")
    code = subprocess.call([str(worker.with_name("pipeline")), "status"])
    if code != 0:
        print(f"error: pipeline status exited with {code}", file=sys.stderr)
        return code
    print("The delayed job waits for the scheduler (.venv/bin/pipeline-scheduler).")
    if stop is not None:
        print(f"Stop Kafka with: .venv/bin/{stop}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
