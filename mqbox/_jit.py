"""The only module that imports numba: every jit option lives here.

Owns: the `kernel` decorator and the registry of kernels that each role warms up before it reports
ready. Never: policy, I/O, or numba options anywhere else.

A kernel is one loop over numpy arrays and integers (STYLE.md section 4). Options are explicit:
`cache=True` so a role that starts after another reuses the compiled machine code from
`__pycache__`, `nogil=True` so a thread may run beside it, `fastmath=False` because offsets and
CRCs must be exact, `boundscheck=False` for speed; `bin/test` runs the store tests once more with
NUMBA_BOUNDSCHECK=1, which overrides this option globally.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
from numba.core import types
from numba.extending import intrinsic

F = TypeVar("F", bound=Callable[..., Any])

JIT_DISABLED = os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0")

_KERNELS: list[Callable[..., Any]] = []


def kernel(function: F) -> F:
    """Compile `function` with mqbox's numba options; keep its Python signature for mypy."""
    compiled = numba.njit(cache=True, nogil=True, fastmath=False, boundscheck=False)(function)
    _KERNELS.append(compiled)
    return cast(F, compiled)


def inline_kernel(function: F) -> F:
    """`kernel`, and numba inlines it into every kernel that calls it (`inline="always"`).

    For small helpers called per record, whose call LLVM's cost model may keep: a 64-bit
    big-endian writer of eight stores was measured to stay a call inside the dispatch kernel.
    The helper stays callable from Python like any kernel.
    """
    compiled = numba.njit(
        cache=True, nogil=True, fastmath=False, boundscheck=False, inline="always"
    )(function)
    _KERNELS.append(compiled)
    return cast(F, compiled)


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
