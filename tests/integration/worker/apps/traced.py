"""A traced job application for ``pipeline-worker --app``: its spans are written, one JSON
object a line, to the file named by ``PIPELINE_TEST_SPANS``.

``traced.parent`` is a plain function (it runs on the worker's thread pool) that enqueues a
``traced.child``, so the file shows whether the child continued the parent's trace.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from pipeline import Pipeline
from pipeline.otel import TracingInterceptor

SPANS_ENV = "PIPELINE_TEST_SPANS"


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """What the test reads of a span: its name, ids, parent, attributes and status."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
    }


class JsonLinesExporter(SpanExporter):
    """Appends each finished span to a file as one JSON line."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._path.open("a", encoding="utf-8") as out:
            for span in spans:
                out.write(json.dumps(span_record(span)) + "\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider()
if SPANS_ENV in os.environ:
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(Path(os.environ[SPANS_ENV]))))

app = Pipeline(middleware=[TracingInterceptor(tracer_provider=provider)])


@app.job("traced.parent")
def parent(n: int) -> None:
    child.enqueue(n=n)


@app.job("traced.child")
def child(n: int) -> None:
    return None
