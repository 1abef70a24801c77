"""From an ``async def`` test: ``drain_async`` and ``run_job_async`` leave the test's event loop
running, so a handler can talk to a server on it (``drain``/``run_job`` block that loop until
the jobs ended: such a handler waited for good)."""

from __future__ import annotations

import asyncio

from pipeline import Pipeline, Settings
from pipeline.testing import InMemoryTransport, JobStatus, run_job_async, stub_worker

LIMIT_S = 5.0
"""The handler's time limit: a run that waits on a blocked loop fails then, instead of hanging."""


def test_a_handler_talks_to_a_server_on_the_test_s_loop() -> None:
    app = Pipeline(Settings(namespace="acme"), transport=InMemoryTransport())

    @app.job("gateway.call", time_limit=LIMIT_S)
    async def call_gateway(port: int) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = await reader.readline()
        writer.close()
        app.enqueue("gateway.answered", {})
        return answer.decode().strip()

    @app.job("gateway.answered")
    def answered() -> None:
        return None

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"pong\n")
        await writer.drain()
        writer.close()

    async def a_test() -> tuple[list[object], JobStatus, object]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            with stub_worker(app, fail_fast=True) as worker:
                call_gateway.enqueue(port=port)
                report = await worker.drain_async()
            result = await run_job_async(app, "gateway.call", {"port": port})
        return [r.job_type for r in report.succeeded], result.status, result.value

    ran, status, value = asyncio.run(a_test())
    assert ran == ["gateway.call", "gateway.answered"]
    assert (status, value) == (JobStatus.SUCCEEDED, "pong")
