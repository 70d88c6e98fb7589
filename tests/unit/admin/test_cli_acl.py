"""Goal: `mqbox acl validate` and `mqbox acl show` read plain_acl.yml as the broker does, never
print a secret key, and fail with one clear line; `mqbox config` hides the broker's own secret;
--access-key goes with --secret-key.

Method: typer.testing.CliRunner against mqbox.admin.cli.app with files in tmp_path; no
processes are started.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from mqbox.admin import broker_ops
from mqbox.admin.cli import app

runner = CliRunner()
ACL_TEXT = """
globalWhiteRemoteAddresses: [10.0.0.*]
accounts:
  - accessKey: admin-key
    secretKey: very-secret-1
    admin: true
  - accessKey: user-key1
    secretKey: very-secret-2
    defaultTopicPerm: PUB
    topicPerms: [TopicA=SUB]
    groupPerms: [GroupA=PUB|SUB]
"""


def test_validate_reports_a_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_TEXT)
    result = runner.invoke(app, ["acl", "validate", str(path)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"{path}: valid, 2 accounts (1 admin)"
    result = runner.invoke(app, ["acl", "validate", str(path), "--json"])
    document = json.loads(result.output)
    assert document["accounts"][1]["topic_perms"] == {"TopicA": "SUB"}
    assert document["accounts"][1]["group_perms"] == {"GroupA": "PUB|SUB"}
    assert "very-secret" not in result.output


def test_validate_names_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_TEXT.replace("defaultTopicPerm: PUB", "defaultTopicPerm: WRITE"))
    result = runner.invoke(app, ["acl", "validate", str(path)])
    assert result.exit_code == 1
    assert "accounts[1] (user-key1): defaultTopicPerm: 'WRITE' is not DENY" in result.output
    assert len(result.output.strip().splitlines()) == 1
    missing = runner.invoke(app, ["acl", "validate", str(tmp_path / "missing.yml")])
    assert missing.exit_code == 1
    assert "cannot read" in missing.output


def test_show_reads_the_file_of_the_home(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "plain_acl.yml").write_text(ACL_TEXT)
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "aclEnable=true\nmqboxNamesrvAccessKey=admin-key\nmqboxNamesrvSecretKey=xyzzy12\n"
    )
    result = runner.invoke(app, ["acl", "show", "--home", str(tmp_path), "--config", str(conf)])
    assert result.exit_code == 0, result.output
    assert f"aclEnable true, file {tmp_path}/conf/plain_acl.yml" in result.output
    assert "global white list: 10.0.0.*" in result.output
    assert "account user-key1: admin false, default topic PUB" in result.output
    assert "very-secret" not in result.output
    shown = runner.invoke(app, ["config", "--config", str(conf), "--json"])
    assert json.loads(shown.output)["broker"]["mqboxNamesrvSecretKey"] == "<hidden>"
    assert "xyzzy12" not in shown.output


def test_an_access_key_needs_its_secret_key() -> None:
    result = runner.invoke(app, ["--access-key", "admin-key", "cluster", "list"])
    assert result.exit_code == 1
    assert "--access-key and --secret-key go together" in result.output
    broker_ops.use_credentials(None)
