"""Goal: the control block's holding words (control_block.py: a pull processor's "I hold pulls
that a queue's growth answers", read by the dispatcher before it sends QUEUES_GREW) are one word
per role, written through the role's own view and read by anyone, apart from every other word of
the block (slots, activity words), and zeroed when the role's process dies, as its activity
word is.

Method: a real ControlBlock (anonymous shared memory, as the supervisor makes it) for many
roles, so the words cross 128-byte lines; each role's word is written through
`holding_words(role_id)` and read back by `holding` for every role.
"""

from __future__ import annotations

from mqbox.server import control_block

ROLE_IDS = tuple(f"pull.{number}" for number in range(40))


def test_each_role_has_its_own_holding_word_apart_from_the_others() -> None:
    control = control_block.ControlBlock.create(ROLE_IDS)
    assert all(control.holding(role_id) == 0 for role_id in ROLE_IDS)
    for number, role_id in enumerate(ROLE_IDS):
        control.role_started(role_id, 1000 + number)
        if number % 3 == 0:
            control.holding_words(role_id)[0] = 1
    assert [control.holding(role_id) for role_id in ROLE_IDS] == [
        1 if number % 3 == 0 else 0 for number in range(len(ROLE_IDS))
    ]
    assert control.active_count() == 0  # the activity words did not move
    assert [control.pid(role_id) for role_id in ROLE_IDS] == [
        1000 + number for number in range(len(ROLE_IDS))
    ]
    assert all(control.generation(role_id) == 1 for role_id in ROLE_IDS)


def test_a_dead_role_holds_nothing() -> None:
    control = control_block.ControlBlock.create(ROLE_IDS)
    control.role_started("pull.1", 4242)
    control.holding_words("pull.1")[0] = 1
    control.role_exited("pull.1")  # killed while it held pulls: they died with it
    assert control.holding("pull.1") == 0
