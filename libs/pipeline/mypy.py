"""A mypy plugin: ``.enqueue`` on a job whose handler takes ``ctx`` anywhere leaves ``ctx`` out.

Without it, mypy drops ``ctx`` from ``.enqueue``'s parameters only when it is the handler's first
parameter (typing's ``Concatenate`` removes leading parameters only). Enable it with::

    [tool.mypy]
    plugins = ["pipeline.mypy"]
"""

from __future__ import annotations

from collections.abc import Callable

from mypy.plugin import MethodSigContext, Plugin
from mypy.types import CallableType

_ENQUEUES = frozenset(
    {
        "pipeline._jobfunction.JobFunction.enqueue",
        "pipeline._jobfunction.BoundEnqueue.enqueue",
    }
)


def _without_ctx(ctx: MethodSigContext) -> CallableType:
    signature = ctx.default_signature
    if "ctx" not in signature.arg_names:
        return signature
    keep = [i for i, name in enumerate(signature.arg_names) if name != "ctx"]
    return signature.copy_modified(
        arg_types=[signature.arg_types[i] for i in keep],
        arg_kinds=[signature.arg_kinds[i] for i in keep],
        arg_names=[signature.arg_names[i] for i in keep],
    )


class PipelinePlugin(Plugin):
    """Adjusts the signatures of the enqueue methods of decorated jobs."""

    def get_method_signature_hook(
        self, fullname: str
    ) -> Callable[[MethodSigContext], CallableType] | None:
        return _without_ctx if fullname in _ENQUEUES else None


def plugin(version: str) -> type[Plugin]:
    """mypy's entry point."""
    return PipelinePlugin
