"""The Dockerfile read as its instructions, so a test can run its steps outside a container."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages), continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            words = rest.split()
            base = words[0]
            for name, value in args.items():
                base = base.replace("${" + name + "}", value)
            stages.append(Stage(base, words[2] if len(words) == 3 else None))
        else:
            stages[-1].instructions.append((keyword, rest))
    return args, stages


def exec_form(args: str) -> list[str]:
    """The argv of CMD/ENTRYPOINT ["a", "b"] (shell form is split like a shell would)."""
    if args.startswith("["):
        argv: list[str] = json.loads(args)
        return argv
    return shlex.split(args)


def copies(stage: Stage) -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY without --from."""
    found = []
    for args in stage.all("COPY"):
        words = args.split()
        if any(word.startswith("--from") for word in words):
            continue
        *sources, destination = [word for word in words if not word.startswith("--")]
        found.append((sources, destination))
    return found
