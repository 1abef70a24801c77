"""The application the schema registry tests run in ``pipeline-worker``.

Each run appends one JSON line ``{"id", "type", "payload"}`` to the file named by
``REGISTRY_TEST_RECORD``, the payload as the handler received it. The registry comes from the
settings (``PIPELINE_SCHEMA_REGISTRY__URL``), as in a deployment.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pipeline import JobContext, Pipeline
from pipeline.schemaregistry import RegistryAvroPayload, SchemaRegistry
from tests.integration.registry.common import INVOICE_SCHEMA, RECORD_ENV

app = Pipeline()
_url = app.settings.schema_registry.url
if _url is None:
    raise RuntimeError("set PIPELINE_SCHEMA_REGISTRY__URL to run this app")
registry = SchemaRegistry(_url)


def _record(ctx: JobContext, job_type: str, payload: dict[str, Any]) -> None:
    line = json.dumps({"id": ctx.id, "type": job_type, "payload": payload}, ensure_ascii=False)
    fd = os.open(os.environ[RECORD_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


@app.job("registry.envelope")
def envelope(greeting: str, n: int, ctx: JobContext) -> None:
    _record(ctx, "registry.envelope", {"greeting": greeting, "n": n})


@app.job("registry.invoice", payload=RegistryAvroPayload(INVOICE_SCHEMA, registry=registry))
def invoice(number: str, total_cents: int, note: str, ctx: JobContext) -> None:
    _record(ctx, "registry.invoice", {"number": number, "total_cents": total_cents, "note": note})
