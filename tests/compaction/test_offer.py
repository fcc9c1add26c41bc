"""``proxy.compaction.offer`` and ``proxy.compaction.references.StoredContent``: which of the
proxy's own tools a request carries."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.compaction.offer import OwnToolOffer
from proxy.compaction.references import SUBSTRING_FIRST_BYTES, StoredContent
from proxy.conversation.canonical import digests_and_chain
from proxy.settings import Settings

S = Settings()
READ, COMPACT = S.read_tool_name, S.compact_tool_name
ART_URL = "/artifacts/art_" + "0123456789abcdef" * 2


def tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def test_the_read_tool_is_offered_and_the_compaction_tool_when_asked() -> None:
    offer = OwnToolOffer(S, StoredContent())
    assert offer.offerable({}, compact_tool=False).names == (READ,)
    both = offer.offerable({}, compact_tool=True)
    assert both.names == (READ, COMPACT) and [t["function"]["name"] for t in both.schemas] == [READ, COMPACT]
    assert both.has(COMPACT)


def test_none_with_tool_choice_none_nor_under_a_clients_name() -> None:
    offer = OwnToolOffer(S, StoredContent())
    assert offer.offerable({"tool_choice": "none"}, compact_tool=True).names == ()
    assert offer.offerable({"tools": [tool(READ), "junk"]}, compact_tool=True).names == (COMPACT,)
    assert OwnToolOffer(Settings(read_tool_enabled=False), StoredContent()).offerable({}, False).names == ()


def request(messages: list[dict[str, Any]]) -> tuple[bytes, list[dict[str, Any]], list[str]]:
    raw = orjson.dumps({"model": "m", "messages": messages})
    return raw, messages, digests_and_chain(messages)[1]


def test_the_read_tool_is_sent_only_when_stored_content_is_named() -> None:
    offer = OwnToolOffer(S, StoredContent())
    offered = offer.offerable({}, compact_tool=True)
    raw, messages, chain = request([{"role": "user", "content": "hi"}])
    assert offer.chosen(offered, raw, messages, chain, False, messages, ()) == [offered.schemas[1]]
    assert offer.chosen(offered, raw, messages, chain, False, messages, ("summary",)) == list(offered.schemas)
    assert offer.expected(offered, False, raw, messages, chain, False) == [offered.schemas[1]]
    assert offer.expected(offered, True, raw, messages, chain, False) == list(offered.schemas)
    raw, messages, chain = request([{"role": "user", "content": f"read {ART_URL}"}])
    assert offer.chosen(offered, raw, messages, chain, False, messages, ()) == list(offered.schemas)


def test_a_long_body_is_answered_by_the_memo_like_a_short_one_by_its_search() -> None:
    stored = StoredContent()
    filler = [{"role": "user", "content": "x" * 1000} for _ in range(SUBSTRING_FIRST_BYTES // 1000 + 2)]
    for named in (False, True):
        messages = [*filler, {"role": "user", "content": f"see {ART_URL}" if named else "see nothing"}]
        raw, messages, chain = request(messages)
        assert len(raw) > SUBSTRING_FIRST_BYTES
        assert stored.may_be_named(raw, messages, chain, False) is named
        assert stored.named(raw, messages, chain, False, messages, ()) is named
        # the forwarded messages differ (a projection changed them): they are read, not the memo's answer
        assert stored.named(raw, messages, chain, False, [{"role": "user", "content": "cut"}], ()) is False
    raw, messages, chain = request([{"role": "user", "content": "short"}])
    assert stored.named(raw, messages, chain, False, messages, ("offload",)) is True
    assert stored.may_be_named(raw, messages, chain, True) is True  # the proxy's own rounds put back


def test_each_schema_is_built_once_and_shared() -> None:
    offer = OwnToolOffer(S, StoredContent())
    first, second = offer.offerable({}, compact_tool=True), offer.offerable({}, compact_tool=True)
    assert all(a is b for a, b in zip(first.schemas, second.schemas, strict=True))


def test_an_offer_has_a_schema_per_name() -> None:
    """``expected`` and ``chosen`` pair names and schemas with a plain ``zip``: an ``Offer`` whose
    lengths differ is refused when built."""
    from proxy.compaction.offer import Offer

    with pytest.raises(ValueError, match="1 names and 0 schemas"):
        Offer(("read",), ())
    assert Offer(("read",), ({"type": "function"},)).has("read")
