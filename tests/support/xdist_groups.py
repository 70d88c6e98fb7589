"""`--dist loadgroup` on pytest 9.2: put the `xdist_group` name back into each test's node id.

Owns: one trylast `pytest_collection_modifyitems` hook (loaded by tests/conftest.py). On an xdist
worker, xdist marks a grouped test by appending `@group` to its node id, which the controller's
scheduler reads to send a group to one worker. It writes the old `item._nodeid`, which pytest 9.2
no longer reads (its ids are structured, `item._id`): every group was silently spread over the
workers, so each worker started its own Spark JVM (pytest-xdist issue 1386). This hook writes the
suffix where pytest reads it, and does nothing when the id already carries it (older pytest, or
an xdist with the fix).

Never: any other change to the ids, or anything outside an xdist worker in loadgroup mode.
"""

from __future__ import annotations

import pytest


def _group_of(item: pytest.Item) -> str | None:
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) if names else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        group = _group_of(item)
        if group is None or item.nodeid.endswith(f"@{group}"):
            continue
        from _pytest.nodeid import NodeId  # pytest >= 9.2 only: older ones took the suffix

        item._id = NodeId.parse(f"{item.nodeid}@{group}")
