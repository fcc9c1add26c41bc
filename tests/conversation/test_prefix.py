"""The per-conversation prefix state (proxy/conversation/prefix.py): one lookback for all consumers."""

from __future__ import annotations

from proxy.conversation.canonical import digests_and_chain
from proxy.conversation.chat_codec import CHAT
from proxy.conversation.prefix import STORED_SESSIONS_PER_PREFIX, PrefixState, PrefixStates
from proxy.defenses.config import DefenseConfig
from proxy.projection import ProjectionMemos, project
from proxy.tokens.counter import TokenCounter


def _history(n: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 else "assistant", "content": f"message {i}"} for i in range(n)]


def test_take_finds_the_longest_kept_prefix_and_owns_it_until_keep() -> None:
    states = PrefixStates()
    _, chain = digests_and_chain(_history(10))
    state = states.take(chain)
    assert state.length == 0 and len(states) == 0
    index = state.chain_index(chain)
    assert index == {h: i for i, h in enumerate(chain)}
    states.keep(chain, state)
    _, longer = digests_and_chain(_history(12))
    again = states.take(longer)
    assert again is state and again.length == 10 and len(states) == 0  # taken: a concurrent request builds its own
    assert states.take(longer).length == 0
    extended = again.chain_index(longer)
    assert extended is not index and len(index) == 10 and len(extended) == 12  # what was handed out never changes
    states.keep(longer, again)
    _, branch = digests_and_chain([*_history(11), {"role": "user", "content": "edited"}])
    assert states.take(branch).length == 0  # the state of 12 is not a prefix of this branch


def test_states_are_bounded_by_positions() -> None:
    states = PrefixStates(max_positions=25)
    for k in range(5):
        _, chain = digests_and_chain([*_history(10), {"role": "user", "content": f"conversation {k}"}])
        state = states.take(chain)
        state.chain_index(chain)
        states.keep(chain, state)
    assert len(states) == 2  # 11 positions each


def test_one_state_holds_the_counts_items_and_index_of_a_projection() -> None:
    counter = TokenCounter("o200k_base")
    memos = ProjectionMemos()
    messages = _history(30)
    digests, chain = digests_and_chain(messages)
    cfg = DefenseConfig(context_window_tokens=100_000)
    project(messages, digests=digests, chain_hashes=chain, events=[], config=cfg, counter=counter,
            session_id="s", memos=memos, codec=CHAT)
    state = memos.prefixes.take(chain)
    assert isinstance(state, PrefixState) and state.length == 30
    assert state.counts[counter.bind(CHAT).memo_key] == [counter.bind(CHAT).count_message(m) for m in messages]
    assert state.items == [] and state.index == {}  # the shortcut needs neither: nothing built
    state.items = CHAT.items(messages)
    state.items_codec = CHAT.name
    memos.prefixes.keep(chain, state)
    assert state.weight() == 61  # 30 counts, 30 items, the state itself


def test_stored_lengths_are_per_session_and_stamp_and_survive_a_concurrent_take() -> None:
    states = PrefixStates()
    _, chain = digests_and_chain(_history(10))
    states.note_stored(chain[:4], session_pk=1, stamp=5)
    assert states.stored_len(chain, 1, since=4) == 4
    assert states.stored_len(chain, 1, since=5) is None  # noted before the session was last trusted
    assert states.stored_len(chain, 2, since=0) is None  # another session's knowledge never answers
    projection = states.take(chain)  # the projection holds the state: the note makes a new one
    assert projection.stored_in(1, 4, chain) == 4
    projection.chain_index(chain)
    states.note_stored(chain, session_pk=2, stamp=6)
    states.keep(chain, projection)  # what the note knew is merged into the state kept
    assert states.stored_len(chain, 2, since=0) == 10 and states.stored_len(chain, 1, since=0) == 4
    kept = states.take(chain)
    assert kept is projection and len(kept.index) == 10


def _projected_and_replied(n: int) -> tuple[PrefixStates, PrefixState, list[str], list[str]]:
    """States holding the projection's state of an ``n``-message history (kept at its chain's end),
    with that state, the history's chain and the chain with a reply after it."""
    states = PrefixStates()
    history = _history(n)
    _, chain = digests_and_chain(history)
    state = states.take(chain)
    state.chain_index(chain)
    states.keep(chain, state)
    _, longer = digests_and_chain([*history, {"role": "assistant", "content": "reply"}])
    return states, state, chain, longer


def test_a_note_stays_on_the_longest_state_and_answers_past_it() -> None:
    """The stored length noted after a reply sits on the projection's state (kept at the client's
    chain end): the next turn finds both; a regenerated request (the same history again) still finds
    the state; a chain that differs inside the stored prefix gets no stored length."""
    states, state, chain, longer = _projected_and_replied(10)
    states.note_stored(longer, session_pk=1, stamp=1)
    assert len(states) == 1
    assert states.stored_len([*longer, "next"], 1, since=0) == 11
    assert states.stored_len(chain, 1, since=0) == 10  # the same history again: its own prefix is stored
    _, other = digests_and_chain([*_history(10), {"role": "assistant", "content": "another reply"}])
    assert states.stored_len([*other, "next"], 1, since=0) == 10  # the history, not the other reply
    again = states.take([*longer, "next"])
    assert again is state and again.length == 10 and len(again.index) == 10
    states.keep(chain, again)
    assert states.take(chain) is state  # the same history again (regenerate) finds it too


def test_a_note_on_a_state_that_knows_the_session_is_made_in_place_with_the_same_answers() -> None:
    """A note for a session the state already has an entry of (or at its bound of sessions) leaves
    the state's weight as it was: it is made in place, the state staying where it is kept; the
    answers and the bound's total are those of a note that takes the state out and puts it back."""
    states, state, chain, longer = _projected_and_replied(6)
    states.note_stored(longer, session_pk=1, stamp=1)  # a new entry: the state is put back, weight + 1
    weight = state.weight()
    assert states._states.total == weight and state.notes_in_place(1) and not state.notes_in_place(2)
    states.note_stored(longer, session_pk=1, stamp=7)
    assert states.take(chain) is state  # (still the one state, where it was kept)
    states.keep(chain, state)
    assert state.weight() == weight and states._states.total == weight
    assert states.stored_len([*longer, "next"], 1, since=6) == 7 and states.stored_len(chain, 1, since=6) == 6
    for pk in range(2, 2 + STORED_SESSIONS_PER_PREFIX):  # up to the bound, then in place: the oldest goes
        states.note_stored(longer, session_pk=pk, stamp=pk + 10)
        assert states._states.total == state.weight() and len(states) == 1
    assert len(state.stored) == STORED_SESSIONS_PER_PREFIX and state.notes_in_place(99)
    assert states.stored_len(chain, 1, since=0) is None  # session 1's entry was the oldest
    assert states.stored_len(chain, 1 + STORED_SESSIONS_PER_PREFIX, since=0) == 6
