"""Payload validation against a handler's annotations, with a pydantic validator built once.

The rule (docs/failures.md, "Payload validation"): pydantic's strict mode, with the values read
as JSON reads them. A value must already have its parameter's type (``"1"`` is not an ``int``,
``1`` is not a ``str``), except where JSON has no such type: an ISO 8601 string is a
``datetime``, ``date``, ``time`` or ``timedelta``, a string is a ``UUID`` or a ``Decimal``, an
integer is a ``float``, and an enum takes its value. A parameter without an annotation takes
anything; ``ctx`` and positional-only parameters are not payload fields; ``**kwargs`` lets other
fields through unchecked. A handler with no annotated payload parameter has no model at all, so
it costs nothing.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any, NotRequired

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic.errors import PydanticSchemaGenerationError, PydanticUserError
from pydantic_core import SchemaValidator
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from ._errors import PayloadValidationError

_log = logging.getLogger("pipeline.jobs")
_TYPED_DICT: Any = TypedDict
"""Called with a name and fields made at run time (what static checkers cannot follow)."""
_MAX_LISTED = 20
"""Field errors listed in one message at most (the rest are counted)."""


class PayloadModel:
    """Validates one job type's payloads; made by :func:`payload_model`.

    The schema is a ``TypedDict`` of the payload parameters, so validating gives the handler's
    keyword arguments directly: one dict, no model instance to build and take apart (this runs
    on every job, in the worker and at enqueue). A parameter with a default is a
    ``NotRequired`` key: when the payload lacks it, the handler's own default applies.
    """

    __slots__ = ("_validate_json", "_validate_python", "_validator", "job_type")

    def __init__(self, job_type: str, validator: SchemaValidator) -> None:
        self.job_type = job_type
        self._validator = validator
        self._validate_json = validator.validate_json
        self._validate_python = validator.validate_python

    def check_json(self, data: bytes) -> dict[str, Any]:
        """The handler's arguments from JSON payload bytes, validated."""
        try:
            return self._validate_json(data)  # type: ignore[no-any-return]
        except ValidationError as exc:
            raise self._error(exc) from None

    def check(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """The handler's arguments from decoded values (e.g. an Avro payload), validated."""
        try:
            return self._validate_python(payload)  # type: ignore[no-any-return]
        except ValidationError as exc:
            raise self._error(exc) from None

    def encoded_check(self, json: bool) -> Callable[[Mapping[str, Any], bytes], None]:
        """A check of an encoded payload (enqueue's), as few calls deep as can be: it runs on
        every job. ``json``: check the JSON bytes, else the payload's values."""
        error = self._error
        if json:
            validate_json = self._validate_json

            def check_json(payload: Mapping[str, Any], data: bytes) -> None:
                try:
                    validate_json(data)
                except ValidationError as exc:
                    raise error(exc) from None

            return check_json
        validate_python = self._validate_python

        def check(payload: Mapping[str, Any], data: bytes) -> None:
            try:
                validate_python(payload)
            except ValidationError as exc:
                raise error(exc) from None

        return check

    def _error(self, exc: ValidationError) -> PayloadValidationError:
        problems = []
        for error in exc.errors(include_url=False):
            field = ".".join(str(part) for part in error["loc"]) or "<payload>"
            got = "" if error["type"] == "missing" else f" (got {_short(error['input'])})"
            problems.append(f"{field}: {error['msg']}{got}")
        listed = problems[:_MAX_LISTED]
        if len(problems) > _MAX_LISTED:
            listed.append(f"and {len(problems) - _MAX_LISTED} more")
        return PayloadValidationError(self.job_type, "; ".join(listed), tuple(problems))


def payload_model(job_type: str, handler: Callable[..., Any]) -> PayloadModel | None:
    """A validator of ``handler``'s payload fields, or ``None`` if none is annotated."""
    try:
        signature = inspect.signature(handler, eval_str=True)
    except Exception as exc:  # any error of evaluating an annotation string
        _log.warning(
            "job type %r: payloads are not validated, its annotations cannot be resolved: %s",
            job_type,
            exc,
        )
        return None
    fields: dict[str, Any] = {}
    annotated = False
    extra = "forbid"
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    for name, param in signature.parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra = "allow"
        if name == "ctx" or param.kind not in keyword:
            continue
        annotation: Any = Any
        if param.annotation is not param.empty:
            annotation = param.annotation
            annotated = annotated or annotation is not Any
        fields[name] = annotation if param.default is param.empty else NotRequired[annotation]
    if not annotated:
        return None
    config = ConfigDict(strict=True, extra=extra, arbitrary_types_allowed=True)  # type: ignore[typeddict-item]
    try:
        schema = _TYPED_DICT(f"{job_type} payload", fields)
        schema.__pydantic_config__ = config
        adapter: TypeAdapter[dict[str, Any]] = TypeAdapter(schema)
    except (PydanticSchemaGenerationError, PydanticUserError, NameError, TypeError) as exc:
        _log.warning(
            "job type %r: payloads are not validated, its annotations have no pydantic schema: %s",
            job_type,
            exc,
        )
        return None
    return PayloadModel(job_type, adapter.validator)  # type: ignore[arg-type]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"
