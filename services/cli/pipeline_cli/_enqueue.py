"""``pipeline enqueue``: send one job from the shell."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pipeline import Pipeline, Priority

from ._output import cli_errors, common_options, json_object, json_option, print_json

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
        headers[name] = value
    return headers


@click.command()
@click.argument("job_type", metavar="TYPE")
@click.option(
    "--payload",
    default="{}",
    show_default=True,
    callback=json_object,
    help="The job's arguments as a JSON object.",
)
@click.option(
    "--priority",
    type=click.Choice([p.value for p in Priority]),
    default=None,
    help="Priority topic to send to [default: default].",
)
@click.option(
    "--delay",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds to wait before the job may run (sent through the deferred topic).",
)
@click.option("--key", default=None, help="Partition key: jobs with one key share a partition.")
@click.option(
    "--idempotency-key",
    default=None,
    help="Deduplication key; also the partition key when given.",
)
@click.option("--tenant", default=None, help="Tenant the job belongs to.")
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=None,
    help="Attempts before dead-lettering.",
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
    type=click.FloatRange(min=0.1),
    default=None,
    help="Seconds to wait for Kafka's acknowledgement [default: the producer's delivery timeout].",
)
@json_option
@common_options
def enqueue(
    job_type: str,
    payload: dict[str, Any],
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

    \b
    Example:
      pipeline enqueue email.send --payload '{"to": "a@b.c"}' --priority high
    """
    if timeout is not None:
        settings = settings.model_copy(
            update={
                "producer": settings.producer.model_copy(update={"delivery_timeout_s": timeout})
            }
        )
    with cli_errors():
        app = Pipeline(settings)
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
