"""The only module that imports numba: every jit option lives here.

Owns: the `kernel` and `inline_kernel` decorators and the registry of kernels that each role
warms up before it reports ready. Never: policy, I/O, or numba options anywhere else.

A kernel is one loop over numpy arrays and integers (docs/style.md section 4). Options are explicit:
`cache=True` so a role that starts after another reuses the compiled machine code from
`__pycache__`, `nogil=True` so a thread may run beside it, `fastmath=False` because offsets and
CRCs must be exact, `boundscheck=False` for speed (`bin/test` runs the store tests once more with
NUMBA_BOUNDSCHECK=1, which overrides this option globally), `_nrt=False` (below). numba's cache
keys a kernel on its own file: a kernel that inlines a changed helper from another file is
stale, which is why bin/test names its cache by the hash of every kernel source.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final, TypeVar, cast

import numba
from numba.core import types
from numba.extending import intrinsic

F = TypeVar("F", bound=Callable[..., Any])

JIT_DISABLED = os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0")

_KERNELS: list[Callable[..., Any]] = []
# `_nrt=False`: compiled without numba's runtime. A kernel allocates nothing (STYLE.md section
# 4), so nothing in it needs reference counting; with the runtime, numba increments and
# decrements (atomically) the count of every array passed to a helper it did not inline, on
# every call, and leaves such pairs around inlined helpers too. Measured: a dispatch step that
# calls a three-array helper twice a record took 96 ns a record with the runtime, 11 without.
# It also makes an allocation inside a kernel fail to compile, which enforces the rule.
_OPTIONS: Final[dict[str, Any]] = {
    "cache": True,
    "nogil": True,
    "fastmath": False,
    "boundscheck": False,
    "_nrt": False,
}


def kernel(function: F) -> F:
    """Compile `function` with mqbox's numba options; keep its Python signature for mypy."""
    return cast(F, _register(numba.njit(**_OPTIONS)(function)))


def inline_kernel(function: F) -> F:
    """`kernel`, inlined by numba into every kernel that calls it (`inline="always"`).

    For the steps and byte helpers a kernel runs per record: LLVM's cost model leaves a call to
    any helper larger than a few loads, and a call passes every array as a struct of seven or
    more words. Still callable from Python like any kernel.
    """
    return cast(F, _register(numba.njit(inline="always", **_OPTIONS)(function)))


def _register(compiled: Callable[..., Any]) -> Callable[..., Any]:
    _KERNELS.append(compiled)
    return compiled


def kernels() -> list[Callable[..., Any]]:
    """Every kernel defined so far (in modules already imported)."""
    return list(_KERNELS)


def is_compiled(function: Callable[..., Any]) -> bool:
    """True when `function` is a numba dispatcher holding at least one compiled signature."""
    signatures = getattr(function, "signatures", None)
    return bool(signatures)


def _compiler_fence_python() -> None:
    """compiler_fence() when numba's JIT is off: plain Python keeps program order anyway."""


@intrinsic
def _compiler_fence_intrinsic(typing_context: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, arguments: Any) -> Any:
        builder.fence("seq_cst", "singlethread")
        return context.get_dummy_value()

    return types.void(), codegen


# A compiler-only fence for kernels: LLVM's `fence syncscope("singlethread") seq_cst`, a signal
# fence. It emits no instruction; it stops the compiler from moving a store of the kernel across
# it, so the stores before it reach memory first in program order. On x86-64 (TSO) the CPU keeps
# that order too, so a process killed at any instant leaves, in the page cache or a shared map,
# every store before the fence if it left any store after it. It orders nothing against another
# CPU's loads beyond what TSO gives; the rings' publication needs no more (ipc/ring.py).
compiler_fence: Callable[[], None] = (
    _compiler_fence_python if JIT_DISABLED else cast(Callable[[], None], _compiler_fence_intrinsic)
)
