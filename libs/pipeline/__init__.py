"""Background jobs on Apache Kafka.

```python
from pipeline import Pipeline

app = Pipeline()

@app.job("email.send", priority="high", max_attempts=3)
def send_email(to: str, subject: str) -> None: ...

send_email.enqueue(to="a@b.c", subject="hi")
app.flush()
```
"""

from ._app import BoundEnqueue, JobFunction, JobHandle, Pipeline
from ._codec import AvroPayload, JobCodec, JsonPayload, PayloadCodec
from ._context import JobContext
from ._errors import (
    ConfigurationError,
    DecodeError,
    EnqueueError,
    KafkaAuthenticationError,
    KafkaUnavailableError,
    NotAuthorizedError,
    PayloadValidationError,
    PipelineError,
    ProducerFatalError,
    SchemaNotFoundError,
    TimeLimitError,
    UnknownJobTypeError,
    UnknownPriorityError,
)
from ._interceptors import CallNext, Interceptor, JobCall
from ._job import AttemptError, Job, PayloadEncoding, Priority
from ._registry import JobOptions, JobType
from ._retry import Backoff, Retry
from ._settings import Settings

__version__ = "0.1.0.dev0"

__all__ = [
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
]
