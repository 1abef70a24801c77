"""Worker heartbeats without a broker: the record's round trip, what decoding skips, staleness,
and how ``pipeline status`` shows them next to the group's members."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pipeline._backlogmodel import GroupMember, GroupMembers
from pipeline._status import StatusSnapshot
from pipeline._workerbeats import (
    STALE_INTERVALS,
    WorkerBeat,
    beat_key,
    by_client_id,
    decode_beat,
    encode_beat,
)
from pipeline_cli._statusrender import print_status, status_json

AT = 1_700_000_000_000


def beat(**changes: object) -> WorkerBeat:
    base = WorkerBeat(
        client_id="worker-1",
        group="ns.workers",
        host="box",
        pid=42,
        started_at_ms=AT - 60_000,
        at_ms=AT,
        interval_s=5.0,
        concurrency=8,
        in_flight=3,
        utilization=0.375,
        jobs_done=120,
        partitions=(("ns.jobs.high", 0), ("ns.jobs.low", 0)),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_a_heartbeat_round_trips_as_versioned_json() -> None:
    value = encode_beat(beat())
    record = json.loads(value)
    assert record["v"] == 2
    assert list(record) == [
        "v",
        "client_id",
        "group",
        "host",
        "pid",
        "started_at_ms",
        "at_ms",
        "interval_s",
        "concurrency",
        "in_flight",
        "utilization",
        "jobs_done",
        "partitions",
        "member_id",
    ]
    assert record["partitions"] == [["ns.jobs.high", 0], ["ns.jobs.low", 0]]
    assert decode_beat("worker-1", value) == beat()


def test_a_version_1_record_without_a_member_id_is_still_read() -> None:
    record = json.loads(encode_beat(beat(member_id="m-1")))
    assert record.pop("member_id") == "m-1"
    record["v"] = 1
    assert decode_beat("worker-1", json.dumps(record).encode()) == beat(member_id="")
    record.update(v=2, member_id=None)
    assert decode_beat("worker-1", json.dumps(record).encode()) == beat(member_id="")


def test_a_later_version_with_more_fields_is_still_read() -> None:
    record = json.loads(encode_beat(beat()))
    record.update(v=2, threads=4)
    decoded = decode_beat("worker-1", json.dumps(record).encode())
    assert decoded == beat()


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"v": 1}',
        b"\xff\xfe",
        json.dumps({**json.loads(encode_beat(beat())), "v": 0}).encode(),
        json.dumps({**json.loads(encode_beat(beat())), "v": "1"}).encode(),
        json.dumps({**json.loads(encode_beat(beat())), "in_flight": -1}).encode(),
        json.dumps({**json.loads(encode_beat(beat())), "in_flight": True}).encode(),
        json.dumps({**json.loads(encode_beat(beat())), "utilization": "high"}).encode(),
        json.dumps({**json.loads(encode_beat(beat())), "interval_s": 0}).encode(),
        json.dumps({**json.loads(encode_beat(beat())), "partitions": [["t"]]}).encode(),
        json.dumps({**json.loads(encode_beat(beat())), "partitions": {"t": 0}}).encode(),
        json.dumps({**json.loads(encode_beat(beat())), "client_id": "someone-else"}).encode(),
        json.dumps({**json.loads(encode_beat(beat())), "member_id": 7}).encode(),
        b"[" * 100_000,
    ],
)
def test_what_is_not_a_heartbeat_is_skipped_without_raising(value: bytes) -> None:
    assert decode_beat("worker-1", value) is None


def test_a_record_is_read_under_its_process_key_or_the_old_client_id_key_only() -> None:
    value = encode_beat(beat())
    assert beat_key("worker-1", "box", 42) == "worker-1@box:42"
    assert decode_beat("worker-1@box:42", value) == beat()
    assert decode_beat("worker-1", value) == beat()  # written before the key had host and pid
    assert decode_beat("worker-1@box:43", value) is None  # another process's key
    assert decode_beat("worker-1@other:42", value) is None


def test_one_heartbeat_per_client_id_unless_live_processes_share_it() -> None:
    at = AT + 1000
    dead = beat(host="pod-old", at_ms=AT - 3_600_000)  # died without its tombstone
    live = beat(host="pod-new")
    assert by_client_id([dead, live], at) == {"worker-1": live}
    older = beat(host="pod-older", at_ms=AT - 7_200_000)
    assert by_client_id([older, dead], at) == {"worker-1": dead}  # stale ones: the newest
    twin = beat(host="pod-twin", in_flight=7)
    other = beat(client_id="worker-2")
    # Two live replicas with one client id: neither is shown as the client id's.
    assert by_client_id([live, twin, other], at) == {"worker-2": other}


def test_a_tombstone_is_no_heartbeat() -> None:
    assert decode_beat("worker-1", None) is None


def test_a_heartbeat_is_stale_after_three_intervals() -> None:
    fresh = beat()
    limit = AT + int(STALE_INTERVALS * fresh.interval_s * 1000)
    assert fresh.age_s(AT + 2500) == 2.5
    assert fresh.age_s(AT - 1000) == 0.0  # the worker's clock ahead of ours: not negative
    assert not fresh.stale_at(limit)
    assert fresh.stale_at(limit + 1)
    assert beat(at_ms=AT - 3_600_000).stale  # now is long after
    assert not beat(at_ms=AT + 10**12).stale


def snapshot(beats: dict[str, WorkerBeat], at: int = AT + 1000) -> StatusSnapshot:
    members = (
        GroupMember("worker-1", "10.0.0.7", (("ns.jobs.high", 0),), "m1"),
        GroupMember("worker-2", "10.0.0.8", (("ns.jobs.high", 1),), "m2"),
    )
    return StatusSnapshot(
        namespace="ns",
        at=at,
        priorities=(),
        retry_tiers=(),
        deferred=(),
        workers=GroupMembers("ns.workers", "STABLE", members),
        scheduler=GroupMembers("ns.scheduler", "EMPTY", ()),
        dead_letters_pending=0,
        schedules=(),
        worker_beats=beats,
    )


def test_status_joins_members_with_their_heartbeats_by_client_id(
    capsys: pytest.CaptureFixture[str],
) -> None:
    taken = snapshot({"worker-1": beat()})
    members = status_json(taken, None)["workers"]["members"]
    assert members[0]["in_flight"] == 3
    assert members[0]["concurrency"] == 8
    assert members[0]["utilization"] == 0.375
    assert members[0]["jobs_done"] == 120
    assert members[0]["pid"] == 42
    assert members[0]["heartbeat_age_s"] == 1.0
    assert members[1]["in_flight"] is None  # no heartbeat
    assert members[1]["utilization"] is None
    print_status(taken, None)
    lines = capsys.readouterr().out.splitlines()
    assert "IN FLIGHT" in next(line for line in lines if line.startswith("CLIENT"))
    assert next(line for line in lines if line.startswith("worker-1")).split()[2:4] == [
        "3/8",
        "38%",
    ]
    assert next(line for line in lines if line.startswith("worker-2")).split()[2:4] == [
        "n/a",
        "n/a",
    ]


def test_members_sharing_a_client_id_each_get_their_own_heartbeat_by_member_id() -> None:
    members = (
        GroupMember("replica", "10.0.0.7", (("ns.jobs.high", 0),), "m-a"),
        GroupMember("replica", "10.0.0.8", (("ns.jobs.high", 1),), "m-b"),
    )
    mine = beat(client_id="replica", host="pod-a", pid=1, in_flight=1, member_id="m-a")
    theirs = beat(client_id="replica", host="pod-b", pid=1, in_flight=5, member_id="m-b")
    beats = {beat_key("replica", b.host, b.pid): b for b in (mine, theirs)}
    taken = dataclasses.replace(
        snapshot(beats), workers=GroupMembers("ns.workers", "STABLE", members)
    )
    assert taken.beat_of(members[0]) == mine
    assert taken.beat_of(members[1]) == theirs
    shown = status_json(taken, None)["workers"]["members"]
    assert [(m["member_id"], m["in_flight"]) for m in shown] == [("m-a", 1), ("m-b", 5)]


def test_a_heartbeat_without_a_member_id_joins_by_the_client_id_no_other_member_claims() -> None:
    members = (
        GroupMember("replica", "10.0.0.7", (("ns.jobs.high", 0),), "m-a"),
        GroupMember("replica", "10.0.0.8", (("ns.jobs.high", 1),), "m-b"),
    )
    claimed = beat(client_id="replica", host="pod-a", in_flight=1, member_id="m-a")
    old = beat(client_id="replica", host="pod-b", in_flight=5)  # before it joined, or v1
    beats = {beat_key("replica", b.host, b.pid): b for b in (claimed, old)}
    taken = dataclasses.replace(
        snapshot(beats), workers=GroupMembers("ns.workers", "STABLE", members)
    )
    assert taken.beat_of(members[0]) == claimed
    assert taken.beat_of(members[1]) == old
    # A member whose own heartbeat is stale shows none, not another replica's.
    stale = dataclasses.replace(claimed, at_ms=AT - 3_600_000)
    beats = {beat_key("replica", b.host, b.pid): b for b in (stale, old)}
    taken = dataclasses.replace(taken, worker_beats=beats)
    assert taken.beat_of(members[0]) is None
    assert taken.beat_of(members[1]) == old


def test_status_shows_a_stale_heartbeat_as_none() -> None:
    taken = snapshot({"worker-1": beat()}, at=AT + 16_000)
    assert taken.beat_of(taken.workers.members[0]) is None
    assert status_json(taken, None)["workers"]["members"][0]["in_flight"] is None
