"""Goal: CI never tests only the slow path: every kernel is a real numba dispatcher.

Method: import every mqbox module (so every `@kernel` registers), then check each registered
kernel compiles and is a numba dispatcher, unless NUMBA_DISABLE_JIT=1 was asked for on purpose
(coverage runs), as aiokafka's conftest checks its C extension.
"""

from __future__ import annotations

import importlib
import pkgutil

import mqbox
from mqbox import _jit


def import_everything() -> None:
    for module in pkgutil.walk_packages(mqbox.__path__, prefix="mqbox."):
        if module.name.startswith("mqbox.spark"):
            continue  # optional extra: pyspark may not be installed
        importlib.import_module(module.name)


def test_kernels_are_numba_dispatchers_unless_jit_is_disabled() -> None:
    import_everything()
    registered = _jit.kernels()
    assert registered, "no kernel registered: the @kernel decorator is not in use"
    for function in registered:
        if _jit.JIT_DISABLED:
            assert not hasattr(function, "py_func")
        else:
            assert hasattr(function, "py_func"), f"{function!r} is not jitted"
