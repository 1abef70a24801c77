"""``pipeline enqueue``: send one job from the shell."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pipeline import Pipeline, PipelineError, Priority
from pipeline import _exitflush as exitflush
from pipeline._cliargs import not_empty
from pipeline._job import MAX_DELAY_S

from ._output import (
    ATTEMPTS_MAX,
    REQUEST_MAX_S,
    Seconds,
    UsageFailure,
    app_settings,
    cli_errors,
    common_options,
    json_object,
    json_option,
    load_app_option,
    print_json,
)

if TYPE_CHECKING:
    from pipeline import Settings


def _parse_header(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE")
        if name in headers:  # the second value silently replaced the first
            raise click.BadParameter(
                f"header {name!r} is given twice; a job has one value per header"
            )
        headers[name] = value
    return headers


@click.command()
@click.argument("job_type", metavar="TYPE")
@click.option(
    "--payload",
    default="{}",
    show_default=True,
    callback=json_object,
    help="The job's arguments as a JSON object; @FILE reads it from a file, - from stdin.",
)
@click.option(
    "--app",
    "app_spec",
    metavar="MODULE[:ATTR]",
    default=None,
    help="The application: TYPE must be one of its job types, whose declared options "
    "(priority, max attempts) are the defaults, and the payload is checked against its "
    "handler before anything is sent.",
)
@click.option(
    "--priority",
    type=click.Choice([p.value for p in Priority]),
    default=None,
    help="Priority topic to send to [default: the type's priority with --app, else default].",
)
@click.option(
    "--delay",
    type=Seconds(min=0, max=MAX_DELAY_S),
    default=None,
    help="Seconds to wait before the job may run (sent through the deferred topic).",
)
@click.option(
    "--key",
    default=None,
    callback=not_empty,
    help="Partition key: jobs with one key share a partition.",
)
@click.option(
    "--idempotency-key",
    default=None,
    help="Deduplication key; also the partition key when given.",
)
@click.option("--tenant", default=None, callback=not_empty, help="Tenant the job belongs to.")
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1, max=ATTEMPTS_MAX),
    default=None,
    help="Attempts before dead-lettering [default: the type's with --app, else the "
    "producer.default_max_attempts setting].",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    callback=_parse_header,
    metavar="NAME=VALUE",
    help="A job header, e.g. traceparent=...; repeatable.",
)
@click.option(
    "--timeout",
    type=Seconds(min=0.1, max=REQUEST_MAX_S),
    default=None,
    help="Seconds to wait for Kafka's acknowledgement [default: the producer's delivery timeout].",
)
@json_option
@common_options
def enqueue(
    job_type: str,
    payload: dict[str, Any],
    app_spec: str | None,
    priority: str | None,
    delay: float | None,
    key: str | None,
    idempotency_key: str | None,
    tenant: str | None,
    max_attempts: int | None,
    headers: dict[str, str],
    timeout: float | None,
    as_json: bool,
    settings: Settings,
) -> None:
    """Enqueue one job of TYPE and print its id once Kafka acknowledged it.

    Exit codes: 0 sent, 1 Kafka unreachable or refusing, 2 a usage mistake (bad option or JSON,
    unknown type or invalid payload with --app; nothing is sent).

    \b
    Examples:
      pipeline enqueue email.send --payload '{"to": "a@b.c"}' --priority high
      pipeline enqueue report.build --app myservice.jobs:app --payload @report.json
      generate-payload | pipeline enqueue report.build --payload -
    """
    with cli_errors():
        loaded = load_app_option(app_spec)
        if loaded is not None:
            settings = app_settings(loaded, settings)
        if timeout is not None:
            producer = settings.producer.model_copy(update={"delivery_timeout_s": timeout})
            settings = settings.model_copy(update={"producer": producer})
        if loaded is None:
            app = Pipeline(settings)
        else:
            if job_type not in loaded.registry:
                known = ", ".join(sorted(t.name for t in loaded.registry)) or "none"
                raise UsageFailure(
                    f"{app_spec} has no job type {job_type!r} (it has: {known}); nothing was sent"
                )
            # The application as it enqueues: its settings (see app_settings), its job types
            # and the interceptors that add headers at enqueue.
            app = Pipeline(settings, middleware=loaded.middleware)
            app.registry = loaded.registry
        try:
            handle = app.submit(
                job_type,
                payload,
                priority=priority,
                delay=delay,
                key=key,
                idempotency_key=idempotency_key,
                tenant=tenant,
                max_attempts=max_attempts,
                headers=headers,
            ).wait()
        except PipelineError:
            # The error says what became of the job; the exit report would say it again, with
            # advice for a script ("call app.flush() before exiting").
            exitflush.unwatch(app)
            raise
    if as_json:
        print_json(
            {
                "id": handle.job_id,
                "topic": handle.topic,
                "partition": handle.partition,
                "offset": handle.offset,
            }
        )
    else:
        click.echo(handle.job_id)
