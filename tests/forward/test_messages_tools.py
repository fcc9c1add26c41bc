"""``proxy.forward.messages_tools.RoundFilter``: the proxy's ``tool_use`` events removed from a
Messages stream, the client's blocks renumbered, a later round's ``message_start`` dropped and the
end held for the relay."""

from __future__ import annotations

import json
from typing import Any

from proxy.forward.messages_tools import RoundFilter, ended_by_the_client
from proxy.forward.sse import SSEEvent


def ev(data: dict[str, Any]) -> SSEEvent:
    payload = json.dumps(data).encode()
    return SSEEvent(data["type"], payload, b"event: " + data["type"].encode() + b"\ndata: " + payload)


def test_a_later_round_is_renumbered_after_the_blocks_already_sent_and_the_proxys_call_removed() -> None:
    f = RoundFilter({"context_proxy_read"}, first_index=2, first_round=False)
    events = [
        ev({"type": "message_start", "message": {"content": []}}),
        ev({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ev({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}),
        ev({"type": "content_block_stop", "index": 0}),
        ev({"type": "content_block_start", "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_x", "name": "context_proxy_read", "input": {}}}),
        ev({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"que'}}),
        ev({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": 'ry": "a"}'}}),
        ev({"type": "content_block_stop", "index": 1}),
        ev({"type": "content_block_start", "index": 2,
            "content_block": {"type": "tool_use", "id": "toolu_y", "name": "read_file", "input": {}}}),
        ev({"type": "content_block_stop", "index": 2}),
        ev({"type": "ping"}),
        ev({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
        ev({"type": "message_stop"}),
    ]
    out = [f.filter(e) for e in events]
    sent = [json.loads(o.data) for o in out if o is not None]
    assert [(d["type"], d.get("index")) for d in sent] == [
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2),
        ("content_block_start", 3), ("content_block_stop", 3), ("ping", None)]
    assert all(o.raw.startswith(b"event: " + o.event.encode()) for o in out if o is not None)
    assert f.own_uses[0]["input"] == {"query": "a"} and f.client_uses == 1 and f.next_index == 4
    assert [json.loads(e.data)["type"] for e in f.held] == ["message_delta", "message_stop"]
    fixed = json.loads(ended_by_the_client(f.held[0]).data)
    assert fixed["delta"]["stop_reason"] == "end_turn" and fixed["usage"] == {"output_tokens": 5}


def test_the_first_rounds_start_and_untouched_events_go_as_received() -> None:
    f = RoundFilter({"context_proxy_read"}, first_index=0, first_round=True)
    start = ev({"type": "message_start", "message": {"content": []}})
    block = ev({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    odd = SSEEvent(None, b"not json", b"data: not json")
    assert f.filter(start) is start and f.filter(block) is block and f.filter(odd) is odd
