"""The job application of the interop tests: ``interop.echo`` records what it was given.

Each run appends one JSON line (id, text, n, topic, partition, key, headers) to the file named by
``INTEROP_RECORD``, with one ``os.write`` on an ``O_APPEND`` file so lines never interleave.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pipeline import Pipeline

RECORD_ENV = "INTEROP_RECORD"

app = Pipeline()


@app.job("interop.echo")
def echo(text: str, n: int, ctx: Any) -> None:
    key = ctx.key.decode() if isinstance(ctx.key, bytes) else ctx.key
    line = {
        "id": ctx.id,
        "text": text,
        "n": n,
        "topic": ctx.topic,
        "partition": ctx.partition,
        "key": key,
        "headers": dict(ctx.headers),
    }
    fd = os.open(os.environ[RECORD_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line, ensure_ascii=False) + "\n").encode())
    finally:
        os.close(fd)
