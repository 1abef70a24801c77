"""The metric names and label names a PromQL expression refers to.

Not a PromQL parser (promtool checks that the expressions parse): a reader of the references,
enough to compare a dashboard's or a rule's queries with what the processes export. String
literals are blanked first (a regex like ``".*"`` names no metric), grouping clauses
(``by (...)``, ``on (...)``...) give the labels of the metrics inside the aggregation they
belong to, selectors ``{...}`` the labels of the metric they follow, and what is left that is
an identifier not called as a function and not a keyword is a metric name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
SELECTOR = re.compile(r"\{([^{}]*)\}")
MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
RANGE = re.compile(r"\[[^\[\]]*\]")
IDENTIFIER = re.compile(r"(?<![\w.:$])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")
KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "group_left",
        "group_right",
        "inf",
        "nan",
        "start",
        "end",
    }
)
"""Identifiers that are PromQL operators, modifiers or number literals, not metrics (functions
and aggregations are recognised by the ``(`` that follows them)."""


@dataclass
class Refs:
    """What one expression refers to: metric -> the labels it is expected to carry."""

    metrics: dict[str, set[str]] = field(default_factory=dict)


def _close(text: str, start: int) -> int:
    """Index just after the parenthesis group opening at ``text[start]``."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] == "(":
            depth += 1
        elif text[index] == ")":
            depth -= 1
            if depth == 0:
                return index + 1
    raise ValueError(f"unbalanced parentheses in {text!r}")


def _open(text: str, end: int) -> int:
    """Index of the ``(`` whose group ends just before ``end`` (a ``)``)."""
    depth = 0
    for index in range(end - 1, -1, -1):
        if text[index] == ")":
            depth += 1
        elif text[index] == "(":
            depth -= 1
            if depth == 0:
                return index
    raise ValueError(f"unbalanced parentheses in {text!r}")


def _names(text: str) -> list[str]:
    bare = RANGE.sub(" ", SELECTOR.sub(" ", GROUPING.sub(" ", text)))
    return [m for m in IDENTIFIER.findall(bare) if m.lower() not in KEYWORDS]


def references(expr: str) -> Refs:
    """The metrics ``expr`` reads, each with the labels the expression selects or groups by."""
    text = STRING.sub('""', expr)
    refs = Refs()
    for match in re.finditer(r"([A-Za-z_:][\w:]*)?\s*\{([^{}]*)\}", text):
        labels = set(MATCHER.findall(match[2]))
        if match[1] is not None and match[1].lower() not in KEYWORDS:
            refs.metrics.setdefault(match[1], set()).update(labels)
        else:
            refs.metrics.setdefault("{}", set()).update(labels)
    scopes: list[tuple[str, set[str]]] = []
    while (group := GROUPING.search(text)) is not None:
        labels = {label.strip() for label in group[2].split(",") if label.strip()}
        after = text[group.end() :].lstrip()
        if group[1] in ("by", "without") and after.startswith("("):
            begin = group.end() + (len(text) - group.end() - len(after))
            scope = text[begin : _close(text, begin)]
        elif group[1] in ("by", "without"):
            before = text[: group.start()].rstrip()
            scope = text[_open(text, len(before)) : len(before)]
        else:  # vector matching: the labels are matched on both sides of the operator
            scope = text
        if group[1] != "without":
            scopes.append((scope, labels))
        text = text[: group.start()] + " " * (group.end() - group.start()) + text[group.end() :]
    for name in _names(text):
        refs.metrics.setdefault(name, set())
    for scope, labels in scopes:
        for name in _names(scope):
            refs.metrics.setdefault(name, set()).update(labels)
    return refs
