"""Applying a role's ACLs (:mod:`pipeline._acls`) idempotently with the admin client.

:func:`apply_acls` describes the bindings the cluster has for the principal, creates only the
missing ones (``dry_run``: none) and reports each rule as created or present, so running it
again creates nothing. Kafka's errors become :class:`~pipeline._errors.TopicAdminError` naming
what was refused (the settings' user needs Alter on the cluster, or to be a super user).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

# confluent-kafka's admin package does not declare its re-exports to type checkers.
from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from ._acls import AclRule, Operation, PatternKind, ResourceKind
from ._adminsession import AdminSession

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._settings import Settings


@dataclass(frozen=True, slots=True)
class AclApplied:
    """What :func:`apply_acls` did: the rules it created (or would create) and those present."""

    created: tuple[AclRule, ...]
    present: tuple[AclRule, ...]


def binding(rule: AclRule) -> AclBinding:
    """The ALLOW binding of ``rule`` for confluent-kafka's ``create_acls``."""
    return AclBinding(
        ResourceType[rule.resource.value],
        rule.name,
        ResourcePatternType[rule.pattern.value],
        rule.principal,
        rule.host,
        AclOperation[rule.operation.value],
        AclPermissionType.ALLOW,
    )


def _rule(found: AclBinding) -> AclRule | None:
    """``found`` as a rule, or ``None`` for a binding no rule can be (a DENY, another type)."""
    try:
        if found.permission_type != AclPermissionType.ALLOW:
            return None
        return AclRule(
            ResourceKind(_name(found.restype)),
            PatternKind(_name(found.resource_pattern_type)),
            found.name,
            Operation(_name(found.operation)),
            found.principal,
            found.host,
        )
    except ValueError:
        return None


def _name(value: object) -> str:
    """An enum member's name (confluent-kafka types these fields as enum, str or int)."""
    return str(getattr(value, "name", value))


def present_acls(session: AdminSession, principal: str) -> set[AclRule]:
    """The ALLOW bindings of ``principal`` on the cluster, as rules."""
    wanted = AclBindingFilter(
        ResourceType.ANY,
        None,  # type: ignore[arg-type]  # None matches any name (the filter's documented use)
        ResourcePatternType.ANY,
        principal,
        None,  # type: ignore[arg-type]  # and any host
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    future = session.client.describe_acls(wanted, request_timeout=session.remaining())
    found = session.result(future, f"describe the ACLs of {principal}", None)
    return {rule for rule in map(_rule, found) if rule is not None}


def apply_acls(
    settings: Settings, rules: Sequence[AclRule], *, dry_run: bool = False, timeout: float = 30.0
) -> AclApplied:
    """Create the bindings of ``rules`` the cluster lacks (``dry_run``: only say which)."""
    session = AdminSession(settings, timeout)
    principals = {rule.principal for rule in rules}
    present: set[AclRule] = set()
    for principal in sorted(principals):
        present |= present_acls(session, principal)
    missing = [rule for rule in rules if rule not in present]
    if missing and not dry_run:
        futures = session.client.create_acls(
            [binding(rule) for rule in missing], request_timeout=session.remaining()
        )
        for made, future in futures.items():
            session.result(future, f"create the ACL {made}", None)
    return AclApplied(
        created=tuple(missing), present=tuple(rule for rule in rules if rule in present)
    )
