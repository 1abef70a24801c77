"""``python -m ops.containers build`` | ``python -m ops.containers compose ARGS...``.

``compose`` runs Docker Compose on docker-compose.yml with the stand-in images, against Podman
(see :mod:`.engine`). The healthchecks run while the command does: ``compose up`` in the
foreground keeps them going, ``compose up -d --wait`` returns once the stack is healthy.
"""

from __future__ import annotations

import sys

from .engine import ComposeStack, EngineError, Podman
from .images import build_all

PROJECT = "kafka-pipeline"
"""docker-compose.yml's ``name``."""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    usage = "usage: python -m ops.containers build | compose [DOCKER-COMPOSE ARGS...]"
    if not argv or argv[0] not in {"build", "compose"} or (argv[0] == "build" and argv[1:]):
        print(usage, file=sys.stderr)
        return 2
    try:
        with Podman() as podman:
            if argv[0] == "build":
                build_all(podman, _say)
                return 0
            with ComposeStack(podman, PROJECT) as stack:
                proc = stack.compose(*argv[1:], timeout=3600, capture=False, check=False)
                return proc.returncode
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
