"""`python -m mqbox.server.warm_up`: compile every kernel a broker's roles use into numba's
cache (NUMBA_CACHE_DIR, else the package's __pycache__), as a first start does, and exit.

Owns: nothing but the call. bin/test runs it beside ruff and mypy, so the test workers' first
appliances load the kernels instead of each compiling all of them at once (about 50 s of a core
each on the 2-core box); an image build can run it for the same reason. Never: sockets, files of
a home, shared memory.
"""

from __future__ import annotations

import logging
import sys

from mqbox.server.supervisor import warm_up_roles
from mqbox.server.topology import ROLE_MAIN


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    warm_up_roles(ROLE_MAIN.values())
    return 0


if __name__ == "__main__":
    sys.exit(main())
