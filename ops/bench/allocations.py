"""Count the Python objects a piece of code allocates (all threads), not just those it keeps.

``tracemalloc``, ``sys.getallocatedblocks()`` and the garbage collector's counts all report what
is alive at a moment; a job's path allocates objects and frees most of them before the next job
starts, so none of them sees those. This counter wraps CPython's object allocator (the
``PYMEM_DOMAIN_OBJ`` domain, which every object comes from) and counts each allocation, freed
or not. It is a few lines of C compiled with the system's C compiler when first used (only the
benchmark needs it), and it costs a counter increment per allocation once installed.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import tempfile
from pathlib import Path

_SOURCE = r"""
#include <stddef.h>
typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr);
} Allocator;
extern void PyMem_GetAllocator(int domain, Allocator *allocator);
extern void PyMem_SetAllocator(int domain, Allocator *allocator);
static Allocator inner;
static unsigned long long allocations;
static void *counting_malloc(void *ctx, size_t size) {
    allocations++;
    return inner.malloc(inner.ctx, size);
}
static void *counting_calloc(void *ctx, size_t nelem, size_t size) {
    allocations++;
    return inner.calloc(inner.ctx, nelem, size);
}
static void *counting_realloc(void *ctx, void *ptr, size_t size) {
    if (ptr == NULL) allocations++;
    return inner.realloc(inner.ctx, ptr, size);
}
static void counting_free(void *ctx, void *ptr) { inner.free(inner.ctx, ptr); }
void install(void) {
    Allocator counting = {NULL, counting_malloc, counting_calloc, counting_realloc, counting_free};
    PyMem_GetAllocator(2 /* PYMEM_DOMAIN_OBJ */, &inner);
    PyMem_SetAllocator(2, &counting);
}
unsigned long long count(void) { return allocations; }
"""


class AllocationCounterError(RuntimeError):
    """The counter cannot be built here."""


class AllocationCounter:
    """``counter.count()``: objects allocated since :meth:`install` (monotonic, every thread)."""

    def __init__(self) -> None:
        compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if compiler is None:
            raise AllocationCounterError(
                "counting allocations needs a C compiler (cc, gcc or clang) to build a 30-line "
                "allocator hook: install one (e.g. `apt-get install gcc`)"
            )
        with tempfile.TemporaryDirectory(prefix="pipeline-alloc-") as tmp:
            source, library = Path(tmp) / "count.c", Path(tmp) / "count.so"
            source.write_text(_SOURCE)
            built = subprocess.run(
                [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(source)],
                capture_output=True,
                text=True,
                check=False,
            )
            if built.returncode != 0:
                raise AllocationCounterError(
                    f"building the allocation counter failed:\n{built.stderr}"
                )
            # Loaded globally so that the hook finds the interpreter's PyMem_* functions.
            self._lib = ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
        self._lib.count.restype = ctypes.c_ulonglong
        self._installed = False

    def install(self) -> None:
        """Start counting (once per process; the hook stays until the process exits)."""
        if not self._installed:
            self._lib.install()
            self._installed = True

    def count(self) -> int:
        return int(self._lib.count())
