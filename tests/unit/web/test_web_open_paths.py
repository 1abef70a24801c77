"""What ``/login`` and ``/logout`` give and take before any login: no Kafka error (it names
brokers and principals), and no form body beyond a small bound, refused before it is read."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from starlette.testclient import TestClient

from pipeline_web._dashboard import MAX_FIELD_BYTES, MAX_FORM_BYTES
from pipeline_web._throttle import MAX_FAILURES

from .conftest import MakeDashboard
from .test_web_pages import dashboard

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.types import Message, Scope

TOKEN = "s3cret-token"
PROBLEM = "KafkaUnavailableError: broker-7.internal:9093: SASL authentication failed for svc-web"


@pytest.fixture
def app(make_dashboard: MakeDashboard) -> Starlette:
    app = make_dashboard("open", token=TOKEN)
    dashboard(app).monitor.problem = PROBLEM
    return app


def _stranger(app: Starlette) -> TestClient:
    return TestClient(
        app,
        base_url="http://dash.example.com",
        client=("203.0.113.9", 40000),
        follow_redirects=False,
    )


# --- Kafka's error -----------------------------------------------------------------------------


def test_the_login_page_does_not_show_kafkas_error_to_a_stranger(app: Starlette) -> None:
    client = _stranger(app)
    page = client.get("/login")
    assert page.status_code == 200
    assert "broker-7" not in page.text
    wrong = client.post("/login", data={"token": "guess"})
    assert wrong.status_code == 401
    assert "broker-7" not in wrong.text
    for _ in range(MAX_FAILURES):
        locked = client.post("/login", data={"token": "guess"})
    assert locked.status_code == 429
    assert "broker-7" not in locked.text


def test_the_pages_behind_the_login_show_kafkas_error(app: Starlette) -> None:
    client = _stranger(app)
    bearer = client.get("/dead-letters", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 200
    assert f"Kafka could not be read: {PROBLEM}" in bearer.text
    logged_in = client.post("/login", data={"token": TOKEN, "next": "/workers"})
    assert logged_in.status_code == 303
    assert PROBLEM in client.get("/workers").text


# --- form bodies -------------------------------------------------------------------------------


def _post_streamed(
    app: Starlette,
    path: str,
    chunks: list[bytes],
    *,
    declared: int | None,
    kind: bytes = b"application/x-www-form-urlencoded",
) -> tuple[int, int]:
    """POST ``chunks`` as a form body to ``path``, straight through ASGI (the test client
    reads a body whole before the application sees it): the status, and how many bytes the
    application read. ``declared``: the Content-Length sent, or none (chunked)."""
    headers = [
        (b"host", b"dash.example.com"),
        (b"content-type", kind),
    ]
    if declared is not None:
        headers.append((b"content-length", str(declared).encode()))
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("203.0.113.9", 40000),
        "server": ("dash.example.com", 80),
    }
    left = list(chunks)
    read = 0
    status: list[int] = []

    async def receive() -> Message:
        nonlocal read
        if status or not left:  # answered (the client stops sending), or all sent
            return {"type": "http.disconnect"} if status else {"type": "http.request"}
        chunk = left.pop(0)
        read += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(left)}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    asyncio.run(app(scope, receive, send))
    return status[0], read


def _large_body(fields: int) -> list[bytes]:
    """A form of ``fields`` fields of 64 KB each (under Starlette's own 1 MB a field), one
    chunk each, and the token last."""
    return [b"f%d=%s&" % (n, b"x" * 65_536) for n in range(fields)] + [b"token=guess"]


@pytest.mark.parametrize("path", ["/login", "/logout"])
def test_a_form_declared_too_large_is_refused_before_any_of_it_is_read(
    app: Starlette, path: str
) -> None:
    body = _large_body(64)
    status, read = _post_streamed(app, path, body, declared=sum(map(len, body)))
    assert status == 413
    assert read == 0


def test_a_chunked_form_too_large_is_refused_once_past_the_bound(app: Starlette) -> None:
    body = _large_body(64)
    status, read = _post_streamed(app, "/login", body, declared=None)
    assert status == 400
    assert read == len(body[0])  # its first field is longer than MAX_FIELD_BYTES already
    assert len(body[0]) > MAX_FIELD_BYTES


def test_a_form_within_the_bounds_still_logs_in(app: Starlette) -> None:
    body = [b"next=%2Fworkers&", b"token=" + TOKEN.encode()]
    status, read = _post_streamed(app, "/login", body, declared=sum(map(len, body)))
    assert status == 303
    assert read == sum(map(len, body)) < MAX_FORM_BYTES


@pytest.mark.parametrize("path", ["/login", "/logout"])
def test_a_multipart_form_is_refused_before_any_of_it_is_read(app: Starlette, path: str) -> None:
    """Its file parts were not bounded by the form's limits: a chunked 200 MB file part to
    /login was read whole (written to a temporary file) before the login was refused."""
    boundary = b"b0undary"
    part = b"--%s\r\nContent-Disposition: form-data; name=f; filename=x\r\n\r\n" % boundary
    body = [part] + [b"x" * 65_536] * 32 + [b"\r\n--%s--\r\n" % boundary]
    kind = b"multipart/form-data; boundary=" + boundary
    status, read = _post_streamed(app, path, body, declared=None, kind=kind)
    assert status == 415
    assert read == 0
