"""Goal: over the wire, the real appliance delays, retries and dead-letters as RocketMQ does: a
send with DELAY=1 cannot be pulled from its topic at once and can be about a second later, with
its body, flag, tags, keys and user properties; CONSUMER_SEND_MSG_BACK (36) puts the message
into `%RETRY%<group>` after its delay level's time with reconsumeTimes + 1, RETRY_TOPIC and
ORIGIN_MESSAGE_ID, and the name server routes that topic; a send-back past maxReconsumeTimes or
with delayLevel -1 lands in `%DLQ%<group>` at once; a bad offset or a malformed header gets
code 1 with a remark while every role keeps running; and a group may send back only records of
the topics it consumes (its heartbeat's subscription, or an offset it committed, or its own
`%RETRY%` topic): the cross-topic read probe (another topic's offset sent back, then read from
the group's DLQ) gets 16 and copies nothing.

Method: one real appliance for the module (`python -m mqbox.server.supervisor` with every role
of the broker's topology and the real name server, port 0, a home of its own) with
messageDelayLevel shrunk to seconds; requests go through mqbox.client.remoting and admin_api.
"Not at once" is checked only while less than DELAY_LEVEL_1_S has passed since the send, so a
slow machine cannot turn it into a false failure; that the broker never delivers early is
checked on the store times instead (delivered store time >= scheduled store time + the delay).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import psutil
import pytest

from mqbox.client import admin_api
from mqbox.client.namesrv_api import get_route
from mqbox.client.remoting import RemotingClient
from mqbox.config import BrokerConfig
from mqbox.message import (
    StoredMessage,
    decode_offset_msg_id,
    decode_properties_str,
    encode_properties_str,
)
from mqbox.protocol.codes import (
    PULL_FLAG_SUBSCRIPTION,
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.headers import (
    ConsumerData,
    ConsumerSendMsgBackRequestHeader,
    HeartbeatData,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    SubscriptionData,
    UpdateConsumerOffsetRequestHeader,
)
from mqbox.server.home import store_root_of
from mqbox.server.roles.processors.topics import SCHEDULE_TOPIC
from tests.conftest import unique_name
from tests.support.appliance import BROKER_CONF, Appliance, running_appliance

pytestmark = pytest.mark.integration

# Level 1 (DELAY=1) and level 3 (a first send-back) wait one second, level 2 two.
DELAY_LEVELS = "1s 2s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s"
DELAY_LEVEL_1_S = 1.0
DELIVERY_TIMEOUT_S = 20.0
ROUTE_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_MS = 5000


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    pids: list[int] = []
    conf = BROKER_CONF + f"messageDelayLevel={DELAY_LEVELS}\n"
    try:
        with running_appliance(tmp_path_factory.mktemp("appliance"), pids, conf) as running:
            yield running
    finally:
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()


@pytest.fixture
def broker(appliance: Appliance) -> Iterator[RemotingClient]:
    with RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as client:
        yield client


# --- helpers ------------------------------------------------------------------------------------


def send(
    broker: RemotingClient, topic: str, body: bytes, **properties: str
) -> SendMessageResponseHeader:
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=1,
        queue_id=0,
        sys_flag=0,
        born_timestamp_ms=int(time.time() * 1000),
        flag=7,
        properties=encode_properties_str(properties).decode(),
    )
    return admin_api.send_message(broker, header, body)


def pull_once(
    broker: RemotingClient, topic: str, queue_index: int = 0, queue_id: int = 0
) -> admin_api.PullResult:
    header = PullMessageRequestHeader(
        "PullGroup", topic, queue_id, queue_index, 32, PULL_FLAG_SUBSCRIPTION, 0, 0, 0, "*"
    )
    return admin_api.pull_message(broker, header)


def pull_until(
    broker: RemotingClient, topic: str, count: int, queue_id: int = 0
) -> list[StoredMessage]:
    """The first `count` messages of the queue, pulling until they are there."""
    found: list[StoredMessage] = []
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while len(found) < count:
        assert time.monotonic() < deadline, f"{topic}: {len(found)} of {count} messages"
        result = pull_once(broker, topic, len(found), queue_id)
        if result.code == ResponseCode.SUCCESS:
            found.extend(result.messages)
        else:
            time.sleep(0.05)
    return found


def subscribe(broker: RemotingClient, group: str, *topics: str) -> None:
    """A push consumer's heartbeat on this connection: `group` subscribes to `topics` and to
    its own retry topic, as every clustering consumer does."""
    subscriptions = tuple(SubscriptionData(topic, "*", (), 1) for topic in topics)
    data = HeartbeatData(
        unique_name("client"),
        (),
        (
            ConsumerData(
                group,
                ConsumeType.CONSUME_PASSIVELY,
                MessageModel.CLUSTERING,
                ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                (*subscriptions, SubscriptionData("%RETRY%" + group, "*", (), 1)),
            ),
        ),
    )
    response = broker.invoke(RequestCode.HEART_BEAT, {}, data.to_json())
    assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)


def send_back_answer(
    broker: RemotingClient,
    group: str,
    log_offset_bytes: int,
    delay_level: int = 0,
    reconsume_times_max: int | None = None,
) -> tuple[int, str | None]:
    header = ConsumerSendMsgBackRequestHeader(
        group, log_offset_bytes, delay_level, max_reconsume_times=reconsume_times_max
    )
    response = broker.invoke(RequestCode.CONSUMER_SEND_MSG_BACK, header.to_ext())
    return response.code, response.remark


def send_back(
    broker: RemotingClient,
    group: str,
    log_offset_bytes: int,
    delay_level: int = 0,
    reconsume_times_max: int | None = None,
) -> None:
    answer = send_back_answer(broker, group, log_offset_bytes, delay_level, reconsume_times_max)
    assert answer[0] == ResponseCode.SUCCESS, answer


def wait_routed(appliance: Appliance, topic: str) -> None:
    deadline = time.monotonic() + ROUTE_TIMEOUT_S
    with RemotingClient(appliance.namesrv_address, REQUEST_TIMEOUT_MS) as namesrv:
        while get_route(namesrv, topic) is None:
            assert time.monotonic() < deadline, f"the name server never routed {topic}"
            time.sleep(0.1)


def log_offset_of(msg_id: str) -> int:
    return decode_offset_msg_id(msg_id)[1]


# --- tests --------------------------------------------------------------------------------------


def test_a_delay_1_message_is_pulled_only_after_its_second(broker: RemotingClient) -> None:
    topic = unique_name("Delayed")
    user = {"TAGS": "TagA", "KEYS": "key-1 key-2", "color": "grün", "UNIQ_KEY": "D" * 32}
    sent_at = time.monotonic()
    answer = send(broker, topic, b"delayed body", DELAY="1", **user)
    first = pull_once(broker, topic)
    if time.monotonic() - sent_at < DELAY_LEVEL_1_S * 0.8:
        assert first.code == ResponseCode.PULL_NOT_FOUND, first
    scheduled = admin_api.view_message(broker, log_offset_of(answer.msg_id))
    assert (scheduled.topic, scheduled.queue_id) == (SCHEDULE_TOPIC, 0)

    (delivered,) = pull_until(broker, topic, 1)
    assert delivered.store_timestamp_ms >= scheduled.store_timestamp_ms + 1000
    assert delivered.store_timestamp_ms < scheduled.store_timestamp_ms + 10_000
    assert (delivered.topic, delivered.queue_id, delivered.queue_index) == (topic, 0, 0)
    assert (delivered.body, delivered.flag) == (b"delayed body", 7)
    assert delivered.born_timestamp_ms == scheduled.born_timestamp_ms
    assert decode_properties_str(delivered.properties) == user
    assert pull_once(broker, topic, 1).code == ResponseCode.PULL_NOT_FOUND


def test_a_send_back_is_retried_after_its_delay_then_dead_letters_past_the_limit(
    appliance: Appliance, broker: RemotingClient
) -> None:
    topic = unique_name("Failing")
    group = unique_name("CG-retry")
    subscribe(broker, group, topic)
    answer = send(broker, topic, b"please retry", TAGS="TagR", KEYS="order-9", shade="blue")
    send_back(broker, group, log_offset_of(answer.msg_id))
    retry_topic = "%RETRY%" + group
    wait_routed(appliance, retry_topic)

    (retry,) = pull_until(broker, retry_topic, 1)
    properties = decode_properties_str(retry.properties)
    assert retry.reconsume_times == 1
    assert retry.body == b"please retry"
    assert properties["RETRY_TOPIC"] == topic
    assert properties["ORIGIN_MESSAGE_ID"] == answer.msg_id
    assert (properties["TAGS"], properties["KEYS"], properties["shade"]) == (
        "TagR",
        "order-9",
        "blue",
    )
    assert not {"DELAY", "REAL_TOPIC", "REAL_QID"} & set(properties)
    original = admin_api.view_message(broker, log_offset_of(answer.msg_id))
    assert retry.store_timestamp_ms >= original.store_timestamp_ms + 1000  # level 3: 1 s

    # Consumed and failed again, with maxReconsumeTimes 1 in the header: a dead letter.
    send_back(broker, group, retry.log_offset_bytes, reconsume_times_max=1)
    dead_topic = "%DLQ%" + group
    (dead,) = pull_until(broker, dead_topic, 1)
    properties = decode_properties_str(dead.properties)
    assert dead.reconsume_times == 2
    assert dead.body == b"please retry"
    assert properties["RETRY_TOPIC"] == topic
    assert properties["ORIGIN_MESSAGE_ID"] == answer.msg_id
    wait_routed(appliance, dead_topic)


def test_delay_level_minus_one_goes_straight_to_the_dlq(broker: RemotingClient) -> None:
    topic = unique_name("Poison")
    group = unique_name("CG-poison")
    subscribe(broker, group, topic)
    answer = send(broker, topic, b"poison", TAGS="TagP")
    sent_back_at = time.monotonic()
    send_back(broker, group, log_offset_of(answer.msg_id), delay_level=-1)
    (dead,) = pull_until(broker, "%DLQ%" + group, 1)
    assert time.monotonic() - sent_back_at < DELIVERY_TIMEOUT_S
    assert dead.reconsume_times == 1
    assert decode_properties_str(dead.properties)["RETRY_TOPIC"] == topic
    assert "DELAY" not in decode_properties_str(dead.properties)
    retry = pull_once(broker, "%RETRY%" + group)
    assert retry.code == ResponseCode.PULL_NOT_FOUND


def test_bad_send_backs_get_code_1_and_the_broker_stays_up(
    appliance: Appliance, broker: RemotingClient
) -> None:
    topic = unique_name("StillUp")
    answer = send(broker, topic, b"first")
    log_offset_bytes = log_offset_of(answer.msg_id)
    bad_requests = [
        ConsumerSendMsgBackRequestHeader("CG-bad", 1 << 50, 0).to_ext(),
        ConsumerSendMsgBackRequestHeader("CG-bad", log_offset_bytes + 3, 0).to_ext(),
        ConsumerSendMsgBackRequestHeader("CG-bad", -1, 0).to_ext(),
        {"group": "CG-bad", "delayLevel": "0"},
        {"group": "CG-bad", "offset": "ten", "delayLevel": "0"},
        {"offset": str(log_offset_bytes), "delayLevel": "0"},
    ]
    for ext in bad_requests:
        response = broker.invoke(RequestCode.CONSUMER_SEND_MSG_BACK, ext)
        assert response.code == ResponseCode.SYSTEM_ERROR, (ext, response)
        assert response.remark, ext
    response = broker.invoke(
        RequestCode.CONSUMER_SEND_MSG_BACK,
        ConsumerSendMsgBackRequestHeader("CG-bad", 1 << 50, 0).to_ext(),
    )
    assert "look message by offset failed" in (response.remark or "")
    send(broker, topic, b"second")
    assert [m.body for m in pull_until(broker, topic, 2)] == [b"first", b"second"]
    assert all(psutil.pid_exists(pid) for pid in appliance.role_pids)


def test_a_send_back_of_another_topics_message_is_refused_and_copies_nothing(
    appliance: Appliance, broker: RemotingClient
) -> None:
    """The cross-topic read probe: a group that consumes only its own topic names the offset of
    a secret message, asking for it in its DLQ at once (delayLevel -1) and as a retry (delayLevel
    0: through SCHEDULE_TOPIC_XXXX queue 2, level 3). Nothing is stored: the group's own messages
    sent back afterwards are the first in its DLQ and the only new entry of that schedule queue
    (the store keeps the order, so a copy of the secret would come first)."""
    secret_topic = unique_name("Secret")
    secret = send(broker, secret_topic, b"not yours")
    group = unique_name("CG-probe")
    own_topic = unique_name("Own")
    subscribe(broker, group, own_topic)
    scheduled_before = admin_api.get_max_offset(broker, SCHEDULE_TOPIC, 2)
    for delay_level in (-1, 0):
        code, remark = send_back_answer(
            broker, group, log_offset_of(secret.msg_id), delay_level=delay_level
        )
        assert code == ResponseCode.NO_PERMISSION, (code, remark)
        assert remark is not None
        assert group in remark
        assert secret_topic not in remark
    # A group with no claim at all (no heartbeat, no offset) is refused the same way.
    stranger = unique_name("CG-stranger")
    code, _remark = send_back_answer(broker, stranger, log_offset_of(secret.msg_id), -1)
    assert code == ResponseCode.NO_PERMISSION

    mine = send(broker, own_topic, b"mine")
    send_back(broker, group, log_offset_of(mine.msg_id), delay_level=-1)
    (dead,) = pull_until(broker, "%DLQ%" + group, 1)
    assert dead.body == b"mine"
    send_back(broker, group, log_offset_of(mine.msg_id), delay_level=0)
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while admin_api.get_max_offset(broker, SCHEDULE_TOPIC, 2) == scheduled_before:
        assert time.monotonic() < deadline, "the own send-back never reached the schedule queue"
        time.sleep(0.05)
    assert admin_api.get_max_offset(broker, SCHEDULE_TOPIC, 2) == scheduled_before + 1
    (retried,) = pull_until(broker, "%RETRY%" + group, 1)
    assert retried.body == b"mine"
    assert all(psutil.pid_exists(pid) for pid in appliance.role_pids)


def test_a_group_without_live_members_may_send_back_what_it_committed_offsets_for(
    appliance: Appliance,
) -> None:
    """A late send-back: the group has no member in the live table (as after a broker restart,
    a reconnect, or 120 s of silence; here it never heartbeated), but it committed an offset for
    the topic, which the broker keeps in consumerOffset.json: the retry still works."""
    topic = unique_name("Late")
    group = unique_name("CG-late")
    with RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as late:
        answer = send(late, topic, b"late retry")
        commit = UpdateConsumerOffsetRequestHeader(group, topic, 0, 1).to_ext()
        committed = late.invoke(RequestCode.UPDATE_CONSUMER_OFFSET, commit)
        assert committed.code == ResponseCode.SUCCESS, committed.remark
        store_root = store_root_of(appliance.home.resolve(), BrokerConfig())
        offsets_file = store_root / "config" / "consumerOffset.json"
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while f"{topic}@{group}" not in (offsets_file.read_text() if offsets_file.exists() else ""):
            assert time.monotonic() < deadline, "admin.0 never saved the committed offset"
            time.sleep(0.1)
        send_back(late, group, log_offset_of(answer.msg_id), delay_level=-1)
        (dead,) = pull_until(late, "%DLQ%" + group, 1)
    assert dead.body == b"late retry"
