"""The Spark lane's fixtures: one local SparkSession per pytest worker, and helpers to put
messages into a topic and read what a query wrote.

Owns: `spark` (mqbox.spark.session.local_session: local[2], no UI, 127.0.0.1, the workers on
this interpreter), SPARK_MARKS (each module's pytestmark: the xdist group "spark" sends every
Spark test of a run to one worker under `--dist loadgroup`, so a run starts one JVM), and
`produce` (which returns once the brokers dispatched what it sent), `options_for`. A test that
reads what a query wrote waits for the dispatcher too (tests/support/read_back.py).

Never: a mock of Spark or of the broker: the session is a real JVM and the brokers are the
real appliance (tests/support/appliance.py). A machine without Java fails here with the one line
saying what to install (session.java_problem), never a skip.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession

from mqbox.client import Producer, SendResult
from mqbox.spark.session import java_problem, local_session
from tests.conftest import unique_name
from tests.support.appliance import Appliance
from tests.support.read_back import wait_dispatched_at

SPARK_MARKS = [pytest.mark.integration, pytest.mark.xdist_group("spark")]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    problem = java_problem()
    if problem is not None:
        pytest.fail(problem)
    session = local_session(unique_name("mqbox-tests"))
    try:
        yield session
    finally:
        session.stop()


def options_for(appliance: Appliance, topic: str, **extra: Any) -> dict[str, str]:
    """The connector's options for `topic` of `appliance`, with `extra` as strings."""
    return {
        "namesrvAddr": appliance.namesrv_address,
        "topic": topic,
        **{name: str(value) for name, value in extra.items()},
    }


def produce(
    appliance: Appliance,
    topic: str,
    bodies: Iterable[bytes],
    **options: Any,
) -> list[SendResult]:
    """Send each body (one sync send each, with `options`: tags, keys, properties), then wait
    until every broker that stored one has dispatched it: the connector plans its reads from
    the queues' max offsets, which follow the answers a moment later."""
    with Producer(unique_name("PG").replace("-", "_"), appliance.namesrv_address) as producer:
        results = [producer.send(topic, body, **options) for body in bodies]
        for broker_name in sorted({result.queue.broker_name for result in results}):
            address = producer.instance.master_address(broker_name)
            assert address is not None, f"no master address for {broker_name}"
            wait_dispatched_at(address)
    return results
