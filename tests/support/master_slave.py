"""A master and its slave for a test: two real appliances with homes of their own and one name
server of their own, so either broker can be stopped and started again while the routes stay.

Owns: `MasterSlave` (the name server, the master's and the slave's appliances, their homes and
the configuration each was started with) and `running_master_slave`, which starts the three and
on the way out stops what is still running (every PID is appended to `reap_pids` as well).
Never: fixed ports. `restart_master` starts the master again on its home and its earlier port,
so clients find it at the address the name server gives again.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from tests.support.appliance import BROKER_CONF, Appliance, running_appliance
from tests.support.namesrv_process import NamesrvProcess, running_namesrv

BROKER_NAME: Final = "broker-a"
# The slave copies its master's metadata twice a second, so tests wait little for a round.
SLAVE_SYNC_INTERVAL_MS: Final = 500
SLAVE_CONF: Final = (
    BROKER_CONF
    + f"brokerName={BROKER_NAME}\nbrokerRole=SLAVE\nbrokerId=1\n"
    + f"mqboxSlaveSyncIntervalMs={SLAVE_SYNC_INTERVAL_MS}\n"
)
MASTER_CONF: Final = BROKER_CONF + f"brokerName={BROKER_NAME}\n"


@dataclasses.dataclass
class MasterSlave:
    """The three processes of a master/slave pair (module docstring)."""

    namesrv: NamesrvProcess
    master: Appliance
    slave: Appliance
    master_conf: str
    stack: contextlib.ExitStack
    reap_pids: list[int]
    master_stack: contextlib.ExitStack | None = None

    @property
    def namesrv_address(self) -> str:
        return self.namesrv.address

    def stop_master(self) -> None:
        """The master's orderly stop (it unregisters from the name server)."""
        assert self.master_stack is not None
        self.master_stack.close()
        self.master_stack = None

    def restart_master(self) -> Appliance:
        """Start the master again on its home and port (its store recovers)."""
        assert self.master_stack is None
        self.master_stack = contextlib.ExitStack()
        self.master = self.master_stack.enter_context(
            running_appliance(
                self.master.home,
                self.reap_pids,
                self.master_conf,
                namesrv_address=self.namesrv_address,
                broker_port=self.master.broker_port,
            )
        )
        return self.master


def _close_master(pair: MasterSlave) -> None:
    if pair.master_stack is not None:
        pair.master_stack.close()
        pair.master_stack = None


@contextlib.contextmanager
def running_master_slave(
    directory: Path,
    reap_pids: list[int],
    *,
    master_conf: str = MASTER_CONF,
    slave_conf: str = SLAVE_CONF,
) -> Iterator[MasterSlave]:
    """The name server, then the master, then the slave, each ready; stopped in reverse."""
    with contextlib.ExitStack() as stack:
        namesrv = stack.enter_context(running_namesrv(directory / "namesrv", reap_pids))
        master_stack = contextlib.ExitStack()
        stack.callback(lambda: _close_master(pair))
        master = master_stack.enter_context(
            running_appliance(
                directory / "master", reap_pids, master_conf, namesrv_address=namesrv.address
            )
        )
        slave = stack.enter_context(
            running_appliance(
                directory / "slave", reap_pids, slave_conf, namesrv_address=namesrv.address
            )
        )
        pair = MasterSlave(namesrv, master, slave, master_conf, stack, reap_pids, master_stack)
        yield pair
