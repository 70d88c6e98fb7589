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

F = TypeVar("F", bound=Callable[..., Any])

JIT_DISABLED = os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0")

_KERNELS: list[Callable[..., Any]] = []


def kernel(function: F) -> F:
    """Compile `function` with mqbox's numba options; keep its Python signature for mypy."""
    compiled = numba.njit(cache=True, nogil=True, fastmath=False, boundscheck=False)(function)
    _KERNELS.append(compiled)
    return cast(F, compiled)


def kernels() -> list[Callable[..., Any]]:
    """Every kernel defined so far (in modules already imported)."""
    return list(_KERNELS)


def is_compiled(function: Callable[..., Any]) -> bool:
    """True when `function` is a numba dispatcher holding at least one compiled signature."""
    signatures = getattr(function, "signatures", None)
    return bool(signatures)
