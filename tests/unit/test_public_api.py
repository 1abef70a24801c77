"""The public surface is what ``pipeline.__all__`` exports: this test pins it.

A change here is a change to the contract other people build against (DESIGN section 9): add
names deliberately, and never remove or rename one without a deprecation in the changelog.
"""

from __future__ import annotations

import pipeline

PUBLIC = {
    "AttemptError",
    "AvroPayload",
    "Backoff",
    "BoundEnqueue",
    "CallNext",
    "ConfigurationError",
    "DecodeError",
    "EnqueueError",
    "Interceptor",
    "Job",
    "JobCall",
    "JobCodec",
    "JobContext",
    "JobFunction",
    "JobHandle",
    "JobOptions",
    "JobType",
    "JsonPayload",
    "KafkaAuthenticationError",
    "KafkaUnavailableError",
    "NotAuthorizedError",
    "PayloadCodec",
    "PayloadEncoding",
    "PayloadValidationError",
    "Pipeline",
    "PipelineError",
    "Priority",
    "ProducerFatalError",
    "Retry",
    "SchemaNotFoundError",
    "Settings",
    "TimeLimitError",
    "UnknownJobTypeError",
    "UnknownPriorityError",
    "__version__",
}


def test_all_is_pinned() -> None:
    assert set(pipeline.__all__) == PUBLIC
    assert len(pipeline.__all__) == len(PUBLIC), "no duplicates in __all__"


def test_every_exported_name_exists() -> None:
    for name in pipeline.__all__:
        assert hasattr(pipeline, name), name


def test_errors_share_one_base() -> None:
    exported = [getattr(pipeline, n) for n in pipeline.__all__]
    errors = [e for e in exported if isinstance(e, type) and issubclass(e, BaseException)]
    assert len(errors) == 14  # twelve errors, Retry and TimeLimitError
    for error in errors:
        assert issubclass(error, pipeline.PipelineError), error


def test_design_contract_names() -> None:
    app = pipeline.Pipeline()
    for name in ("job", "enqueue", "flush", "enqueue_many", "submit"):
        assert callable(getattr(app, name)), name
