"""Goal: every shared-memory object of an instance has one well-formed name, and the sweep a
supervisor runs after a dead instance removes exactly that instance's objects, doorbells included.

Method: build and parse names, including hypothesis-chosen parts; create real rings (segment plus
FIFO in /dev/shm) for two instances, sweep one, and check the other is untouched. A fake
directory holds lookalike names that must not match.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.errors import ConfigError
from mqbox.ipc import names
from mqbox.ipc.ring import Ring

parts = st.text(
    alphabet=st.sampled_from("abcXYZ019_-"), min_size=1, max_size=names.PART_SIZE_CHARS_MAX
)


def test_shm_name_has_the_documented_shape() -> None:
    assert names.shm_name("prod-1", "reactor_send", 3) == "/mqbox.prod-1.reactor_send.3"
    assert names.shm_path("/mqbox.a.b.0") == Path("/dev/shm/mqbox.a.b.0")
    assert names.doorbell_path("/mqbox.a.b.0") == Path("/dev/shm/mqbox.a.b.0.doorbell")


@given(instance=parts, role=parts, index=st.integers(0, 999_999_999))
def test_names_parse_back_to_their_parts(instance: str, role: str, index: int) -> None:
    parsed = names.parse_shm_name(names.shm_name(instance, role, index))
    assert parsed == names.ShmName(instance, role, index)


@pytest.mark.parametrize(
    ("instance", "role", "index"),
    [("a.b", "r", 0), ("", "r", 0), ("a", "r/w", 0), ("a", "r", -1), ("a", "x" * 65, 0)],
)
def test_bad_parts_are_refused(instance: str, role: str, index: int) -> None:
    with pytest.raises(ConfigError):
        names.shm_name(instance, role, index)


@pytest.mark.parametrize(
    "name", ["mqbox.a.b.0", "/mqbox.a.b", "/mqbox.a.b.01", "/other.a.b.0", "/mqbox.a.b.0.doorbell"]
)
def test_foreign_names_do_not_parse(name: str) -> None:
    with pytest.raises(ConfigError):
        names.parse_shm_name(name)


def test_sweep_removes_one_instance_and_nothing_else(shm_instance: str) -> None:
    other_instance = shm_instance + "-other"
    rings = [
        Ring.create(names.shm_name(shm_instance, "reactor", 0), 4096),
        Ring.create(names.shm_name(shm_instance, "codec", 1), 4096),
        Ring.create(names.shm_name(other_instance, "reactor", 0), 4096),
    ]
    try:
        found = names.instance_paths(shm_instance)
        assert [path.name for path in found] == [
            f"mqbox.{shm_instance}.codec.1",
            f"mqbox.{shm_instance}.codec.1.doorbell",
            f"mqbox.{shm_instance}.reactor.0",
            f"mqbox.{shm_instance}.reactor.0.doorbell",
        ]
        assert stat.S_ISFIFO(found[1].stat().st_mode)
        assert {shm_instance, other_instance} <= set(names.instances())
        for ring in rings:
            ring.close()
        assert names.unlink_instance(shm_instance) == found
        assert names.instance_paths(shm_instance) == []
        assert len(names.instance_paths(other_instance)) == 2
        assert names.unlink_instance(shm_instance) == []
    finally:
        for ring in rings:
            ring.close()
        names.unlink_instance(shm_instance)
        names.unlink_instance(other_instance)
    assert names.instance_paths(other_instance) == []


def test_sweep_ignores_lookalikes(tmp_path: Path) -> None:
    keep = ["mqbox.ab.r.0", "mqbox.a.r", "mqboxa.r.0", "mqbox.a.r.0.extra", "sem.mqbox.a.r.0"]
    remove = ["mqbox.a.r.0", "mqbox.a.r.12.doorbell"]
    for file_name in keep + remove:
        (tmp_path / file_name).touch()
    assert names.instances(tmp_path) == ["a", "ab"]
    assert [path.name for path in names.unlink_instance("a", tmp_path)] == sorted(remove)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(keep)
