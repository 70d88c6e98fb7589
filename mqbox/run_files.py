"""Run-time JSON files (a supervisor's state, a name server's ready and statistics files).

Owns: `write_json_atomically` (over `write_bytes_atomically`, for a writer that serialized the
document itself) and `read_json`, the one way the broker and the name server write and read the
small JSON files other processes poll. Never: configuration or store files, which
must survive a crash (store/mapped_file.write_file_atomically fsyncs them). A leaf: imports
nothing of mqbox.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_json_atomically(path: Path, document: Mapping[str, Any]) -> None:
    """Replace `path` with `document` so a reader sees the old or the new file, never a part.
    Run-time state only: no fsync, a crash loses nothing that matters."""
    text = json.dumps(document, indent=1, sort_keys=True) + "\n"
    write_bytes_atomically(path, text.encode("utf-8"))


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` (a JSON document) as write_json_atomically does."""
    temp_path = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp_path.write_bytes(data)
    temp_path.replace(path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None if there is none, it is unreadable, or not an object."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None
