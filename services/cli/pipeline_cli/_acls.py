"""``pipeline acls plan|apply``: the least-privilege ACLs of a role in a namespace.

The rules come from :func:`pipeline._acls.plan_acls`; ``apply`` creates the missing ones with
the settings' user (an admin: a super user or one allowed Alter on the cluster).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pipeline._aclapply import apply_acls
from pipeline._acls import Role, plan_acls

from ._output import (
    cli_errors,
    common_options,
    json_option,
    print_json,
    print_table,
    timeout_option,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pipeline._acls import AclRule
    from pipeline._settings import Settings


@click.group(name="acls")
def acls() -> None:
    """The ACLs each role needs in a namespace, on a cluster that authorizes (docs/security.md).

    Roles: producer (enqueues), worker, scheduler, operator (status, dlq, schedules, web) and
    admin (topics apply). Group and transactional ids follow the settings, as the processes do.
    """


WILDCARD = "User:*"
"""Kafka's principal that matches every user."""


def _role_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--principal",
        required=True,
        metavar="User:NAME",
        help="The principal to allow, e.g. User:orders-service.",
    )(command)
    return click.option(
        "--role",
        required=True,
        type=click.Choice([r.value for r in Role]),
        help="What the principal does.",
    )(command)


def _plan(settings: Settings, role: str, principal: str) -> list[AclRule]:
    try:
        rules = plan_acls(role, principal, settings)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--principal'") from None
    if principal == WILDCARD:
        click.echo(
            f"warning: {WILDCARD} is Kafka's wildcard principal: every client that connects "
            f"(ANONYMOUS too, on a listener without authentication) gets the {role} role's "
            "ACLs; name one user (User:NAME) unless that is what you mean",
            err=True,
        )
    return rules


def _print(rules: Sequence[AclRule], states: Sequence[str] | None = None) -> None:
    rows = [
        [*([states[i]] if states else []), r.resource, r.pattern, r.name, r.operation, r.why]
        for i, r in enumerate(rules)
    ]
    columns = ["resource", "pattern", "name", "operation", "why"]
    print_table(rows, ["state", *columns] if states else columns)


@acls.command()
@_role_options
@json_option
@common_options
@cli_errors()
def plan(settings: Settings, role: str, principal: str, as_json: bool) -> None:
    """Print the ACLs PRINCIPAL needs as ROLE; no Kafka call."""
    rules = _plan(settings, role, principal)
    if as_json:
        print_json([rule.as_json() for rule in rules])
    else:
        _print(rules)


@acls.command()
@_role_options
@click.option("--dry-run", is_flag=True, help="Show what would be created; create nothing.")
@timeout_option
@json_option
@common_options
@cli_errors()
def apply(
    settings: Settings, role: str, principal: str, dry_run: bool, timeout: float, as_json: bool
) -> None:
    """Create the ACLs PRINCIPAL needs as ROLE that the cluster lacks.

    Idempotent: a second run reports every ACL present and creates nothing.
    """
    rules = _plan(settings, role, principal)
    done = apply_acls(settings, rules, dry_run=dry_run, timeout=timeout)
    created = "would create" if dry_run else "created"
    if as_json:
        print_json(
            {
                "dry_run": dry_run,
                "created": [rule.as_json() for rule in done.created],
                "present": [rule.as_json() for rule in done.present],
            }
        )
        return
    states = [created if rule in done.created else "present" for rule in rules]
    _print(rules, states)
    click.echo(f"{len(done.created)} {created}, {len(done.present)} present", err=True)
