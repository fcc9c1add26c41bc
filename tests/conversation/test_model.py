"""The neutral model's rules (proxy/conversation/model.py): binding, pairing groups, cuts."""

from __future__ import annotations

import pytest

from proxy.conversation.model import (
    ASSISTANT,
    BINDS_NEXT,
    BINDS_PREVIOUS,
    CALL,
    OPAQUE,
    SYSTEM,
    TOOL,
    USER,
    Conversation,
    Item,
    bound_to_previous,
    group_start,
    is_user_turn,
)

S = Item(SYSTEM, "system")
U = Item(USER, "user")
A = Item(ASSISTANT, "assistant")
AC = Item(ASSISTANT, "assistant", calls=("a", "b"))
TA = Item(TOOL, "tool", answers=("a",), is_answer=True, binds=BINDS_PREVIOUS)
TB = Item(TOOL, "tool", answers=("b",), is_answer=True, binds=BINDS_PREVIOUS)
X = Item(OPAQUE, "ipython", binds=BINDS_PREVIOUS)
R = Item(OPAQUE, "reasoning", binds=BINDS_NEXT, sealed=True)  # Responses: reasoning + encrypted_content
FC = Item(CALL, "function_call", calls=("c",))


def test_answers_and_opaque_items_bind_to_the_item_before() -> None:
    items = [S, U, AC, TA, TB, X, U]
    assert [bound_to_previous(items, i) for i in range(len(items))] == [False, False, False, True, True, True, False]
    assert group_start(items, 5) == 2 and group_start(items, 6) == 6 and group_start(items, 1) == 1
    assert [group_start(items, i) for i in range(len(items))] == [0, 1, 2, 2, 2, 2, 6]
    assert TA.is_answer and not AC.is_answer and is_user_turn(U) and not is_user_turn(TA)


def test_an_item_bound_to_the_next_is_never_the_last_of_a_kept_prefix() -> None:
    """A Responses reasoning item is bound to the item after it: a kept tail never starts right
    after it (the reasoning would be cut from the call it produced)."""
    items = [S, U, R, FC, Item(TOOL, "function_call_output", answers=("c",), is_answer=True, binds=BINDS_PREVIOUS), U]
    assert group_start(items, 3) == 2 and group_start(items, 4) == 2
    assert [group_start(items, i) for i in range(len(items))] == [0, 1, 2, 2, 2, 5]


def test_a_cut_never_falls_inside_a_group_on_every_short_history() -> None:
    import itertools

    alphabet = [U, A, AC, TA, TB, X, R, FC]
    for n in range(1, 5):
        for combo in itertools.product(alphabet, repeat=n):
            items = [S, *combo]
            for i in range(len(items)):
                s = group_start(items, i)  # a group's first item: nothing between it and i is cut from it
                assert s <= i and not bound_to_previous(items, s)
                assert all(bound_to_previous(items, j) for j in range(s + 1, i + 1))


def test_a_conversation_checks_its_lengths() -> None:
    with pytest.raises(ValueError, match="2 pieces but 1 items"):
        Conversation({}, b"{}", [{}, {}], [U], ["d", "d"], ["c", "c"])
