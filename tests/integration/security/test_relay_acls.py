"""A retry relay refused a look at its former group warns and waits; the worker runs its jobs.

A worker whose group is not ``<ns>.workers`` had its relay in ``<group>.retry`` in earlier
releases; a starting relay reads that group's offsets (and counts its members) before it joins
``<ns>.workers.retry`` (``pipeline_worker.recovery.handover``). Here the user has its role's
ACLs but DESCRIBE on that group: Kafka refuses the look, and the worker used to stop. It runs
its jobs now, and its relay, naming the missing ACL once, joins nothing meanwhile.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from pipeline import Pipeline, Settings
from pipeline._aclapply import apply_acls
from pipeline._acls import Operation, Role, plan_acls
from pipeline._admin import apply_topics
from pipeline._topics import former_retry_group
from pipeline_cli._devusers import client_env
from tests.integration.worker.harness import Recording, WorkerLauncher, wait_until

if TYPE_CHECKING:
    from pathlib import Path

    from pipeline_cli.devbroker import DevCluster

WITHIN_S = 60.0
"""A bound on the worker's start (its interpreter's included) and first job."""


def test_a_relay_refused_its_former_group_waits_and_the_worker_runs_jobs(
    secure_cluster: DevCluster, tmp_path: Path
) -> None:
    namespace = f"relayacl{uuid.uuid4().hex[:8]}"
    superuser = Settings(
        bootstrap_servers=secure_cluster.bootstrap_servers,
        namespace=namespace,
        security=secure_cluster.security(),
        worker={"group_id": f"{namespace}.fleet"},
    )
    apply_topics(superuser)
    former = former_retry_group(superuser)
    assert former == f"{namespace}.fleet.retry"
    name = f"{namespace}-worker"
    security = secure_cluster.add_user(name)
    rules = plan_acls(Role.WORKER, f"User:{name}", superuser)
    kept = [r for r in rules if not (r.name == former and r.operation is Operation.DESCRIBE)]
    assert len(kept) == len(rules) - 1
    apply_acls(superuser, kept)

    record = tmp_path / "record.txt"
    record.touch()
    recording = Recording(record)
    env = {
        **client_env(superuser.bootstrap_servers, security),
        "PIPELINE_WORKER__GROUP_ID": f"{namespace}.fleet",
    }
    launcher = WorkerLauncher(superuser, record, tmp_path, env=env)
    app = Pipeline(superuser)
    try:
        worker = launcher.start()
        job_id = app.enqueue("noop", {"n": 1}, wait=True)
        warned = f"lacks DESCRIBE on GROUP {former} (GROUP_AUTHORIZATION_FAILED)"

        def warned_and_ran() -> bool:
            recording.refresh()
            return warned in worker.log() and job_id in recording.finished_ids

        wait_until(
            warned_and_ran,
            timeout=WITHIN_S,
            what="the relay's warning and the job's run",
            watch=[worker],
        )
        worker.terminate()
        assert worker.wait(timeout=WITHIN_S) == 0, worker.log_tail()
    finally:
        app.close()
        launcher.stop_all()
    log = worker.log()
    [line] = [line for line in log.splitlines() if warned in line]
    assert " WARNING " in line, log
    assert f"does not join {namespace}.workers.retry yet" in line, log
    assert f"`pipeline acls apply --role worker --principal User:{name}`" in line, log
    assert "retry tier partitions assigned" not in log  # it relayed nothing meanwhile
