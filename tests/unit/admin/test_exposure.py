"""Goal: `mqbox start` warns exactly when a listener binds an address other hosts reach while
aclEnable is false, and the warning says what anyone can then do and how to close it; the
listen-address keys load, fall back as documented, and refuse what is not an IPv4 address.

Method: ops.exposure_warning and the config loaders on hand-made configurations (the real start
is tests/integration/test_exposure_cli.py).
"""

from __future__ import annotations

import pytest

from mqbox.admin.ops import exposure_warning
from mqbox.config import (
    BrokerConfig,
    NamesrvConfig,
    broker_listen_address,
    broker_white_list_of,
    load_broker_config,
    load_namesrv_config,
)
from mqbox.errors import ConfigError


def test_loopback_listeners_get_no_warning() -> None:
    assert exposure_warning(NamesrvConfig(), BrokerConfig()) is None
    local = BrokerConfig(listen_address="127.0.0.5")
    assert exposure_warning(NamesrvConfig(listen_address="127.0.0.1"), local) is None


def test_a_broker_on_every_interface_without_acl_is_warned_about() -> None:
    warning = exposure_warning(NamesrvConfig(), BrokerConfig(listen_address="0.0.0.0"))
    assert warning is not None
    assert "aclEnable=false" in warning
    assert "0.0.0.0" in warning
    for what in ("send", "read every topic", "delete topics", "reset any group's offsets"):
        assert what in warning
    assert "name server" not in warning
    assert "mqboxListenAddress=127.0.0.1" in warning
    assert "docs/security.md" in warning


def test_brokerip1_is_the_broker_listen_address_unless_one_is_set() -> None:
    exposed = BrokerConfig(broker_ip1="10.0.0.5")
    assert broker_listen_address(exposed) == "10.0.0.5"
    warning = exposure_warning(NamesrvConfig(), exposed)
    assert warning is not None
    assert "10.0.0.5" in warning
    kept_local = BrokerConfig(broker_ip1="10.0.0.5", listen_address="127.0.0.1")
    assert broker_listen_address(kept_local) == "127.0.0.1"
    assert exposure_warning(NamesrvConfig(), kept_local) is None


def test_an_exposed_name_server_is_warned_about_with_its_white_list() -> None:
    namesrv = NamesrvConfig(listen_address="0.0.0.0", broker_white_list=("10.0.0.0/8",))
    warning = exposure_warning(namesrv, BrokerConfig())
    assert warning is not None
    assert "name server listens on 0.0.0.0" in warning
    assert "register brokers" in warning
    assert "10.0.0.0/8" in warning


def test_acl_on_silences_the_warning() -> None:
    namesrv = NamesrvConfig(listen_address="0.0.0.0")
    broker = BrokerConfig(listen_address="0.0.0.0", acl_enable=True)
    assert exposure_warning(namesrv, broker) is None


def test_the_keys_load() -> None:
    broker = load_broker_config(
        overrides={"mqboxListenAddress": "0.0.0.0", "aclEnable": "true", "brokerIP1": "10.1.1.1"}
    )
    assert (broker.listen_address, broker.acl_enable, broker.broker_ip1) == (
        "0.0.0.0",
        True,
        "10.1.1.1",
    )
    assert load_broker_config(overrides={"mqboxListenAddress": ""}).listen_address == ""
    namesrv = load_namesrv_config(
        overrides={
            "mqboxListenAddress": "0.0.0.0",
            "mqboxNamesrvBrokerWhiteList": "local, 10.0.0.0/8",
        }
    )
    assert namesrv.listen_address == "0.0.0.0"
    assert namesrv.broker_white_list == ("local", "10.0.0.0/8")
    assert load_namesrv_config().broker_white_list == ()  # unset: the name server reads `local`
    assert broker_white_list_of(load_namesrv_config()) == ("local",)
    assert load_namesrv_config().listen_address == "127.0.0.1"


@pytest.mark.parametrize("address", ["localhost", "::1", "10.0.0", "300.1.1.1"])
def test_a_listen_address_that_is_not_ipv4_is_a_config_error(address: str) -> None:
    with pytest.raises(ConfigError, match="mqboxListenAddress"):
        load_broker_config(overrides={"mqboxListenAddress": address})
    with pytest.raises(ConfigError, match="mqboxListenAddress"):
        load_namesrv_config(overrides={"mqboxListenAddress": address})


def test_a_bad_white_list_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="mqboxNamesrvBrokerWhiteList"):
        load_namesrv_config(overrides={"mqboxNamesrvBrokerWhiteList": "example.com"})
