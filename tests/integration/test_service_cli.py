"""The services' command lines against a real Kafka: a setting a service does not use is
warned about, and the service works (the argument checks themselves need no broker:
tests/unit/test_cliargs.py, tests/unit/test_settings.py)."""

from __future__ import annotations

from pathlib import Path

from pipeline import Pipeline
from pipeline._admin import apply_topics
from pipeline._settings import Settings
from tests.integration.scheduler.conftest import (
    SchedulerFactory,
    collect,
    job_consumer,
    scheduler_env,
)

APP = "tests.integration.scheduler.cronapp:app"


def test_the_scheduler_releases_jobs_with_an_invalid_worker_setting_in_its_environment(
    settings: Settings, tmp_path: Path
) -> None:
    """An environment shared with the workers, with a worker setting the scheduler never
    reads that is invalid: the scheduler exited 2 before it, now it leads and releases."""
    apply_topics(settings)
    schedulers = SchedulerFactory(settings, tmp_path)
    env = {
        **scheduler_env(horizon_s=2, wait_tiers_s=[1, 4, 15]),
        "PIPELINE_WORKER__CONCURRENCY": "0",
    }
    try:
        scheduler = schedulers.start(env, app=APP)  # whose Pipeline() reads the environment
        schedulers.wait_leading(scheduler)
        app = Pipeline(settings)
        job_id = app.enqueue("shared.environment", {}, delay=1)
        app.flush(30)
        consumer = job_consumer(settings)
        try:
            released = collect(consumer, 1, 30, job_type="shared.environment")
        finally:
            consumer.close()
        assert [r.job.id for r in released] == [job_id], scheduler.output()
        output = scheduler.output()
        assert (
            "pipeline-scheduler does not use the worker settings and ignores these invalid ones: "
            "worker.concurrency (environment variable PIPELINE_WORKER__CONCURRENCY)"
        ) in output
        assert output.count("does not use the worker settings") == 1, output
    finally:
        for process in schedulers.started:
            process.kill()
