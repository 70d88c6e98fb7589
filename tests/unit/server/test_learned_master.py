"""Goal: the master a slave learned from the name server (server/learned_master.py) is filed
when a registration answer names one, kept when an answer names none or something that is not
host:port, replaced when it changes, and ignored when an earlier supervisor wrote it (its port
may be another broker's by now).

Method: the functions on a real home in tmp_path; both writer and reader run in this process, so
they share a parent pid as the services and HA client roles share their supervisor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mqbox.server.home import prepare_home
from mqbox.server.learned_master import learned_master, master_path, record_master


def test_an_answer_naming_the_master_is_filed_and_read(tmp_path: Path) -> None:
    prepare_home(tmp_path)
    assert learned_master(tmp_path) == ""
    assert record_master(tmp_path, "127.0.0.1:10912", "127.0.0.1:10911")
    assert learned_master(tmp_path) == "127.0.0.1:10912"
    assert not record_master(tmp_path, "127.0.0.1:10912", "127.0.0.1:10911")  # unchanged


def test_an_answer_without_a_master_keeps_the_last_one(tmp_path: Path) -> None:
    prepare_home(tmp_path)
    record_master(tmp_path, "127.0.0.1:10912", "127.0.0.1:10911")
    assert not record_master(tmp_path, None, None)
    assert not record_master(tmp_path, "", "")
    assert not record_master(tmp_path, "no-port", "127.0.0.1:10911")
    assert learned_master(tmp_path) == "127.0.0.1:10912"


def test_a_moved_master_replaces_the_address(tmp_path: Path) -> None:
    prepare_home(tmp_path)
    record_master(tmp_path, "127.0.0.1:10912", "127.0.0.1:10911")
    assert record_master(tmp_path, "127.0.0.1:20912", "127.0.0.1:20911")
    assert learned_master(tmp_path) == "127.0.0.1:20912"


def test_a_file_from_an_earlier_supervisor_is_ignored(tmp_path: Path) -> None:
    prepare_home(tmp_path)
    stale = {"ha_server_addr": "127.0.0.1:10912", "supervisor_pid": os.getppid() + 1}
    master_path(tmp_path).write_text(json.dumps(stale), encoding="utf-8")
    assert learned_master(tmp_path) == ""
    # The same address from this run's registration is filed again, under this supervisor.
    assert record_master(tmp_path, "127.0.0.1:10912", "127.0.0.1:10911")
    assert learned_master(tmp_path) == "127.0.0.1:10912"
