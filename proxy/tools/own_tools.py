"""Keeping the proxy's own tools away from the client.

The client only ever sees a normal answer: content, or calls to *its own* tools. Strategy for a
response that calls the proxy's tools:

- only the proxy's tools: the proxy serves the calls itself, appends the round (the assistant's
  calls and the tool results) to the forwarded messages, and asks the model again while the
  read budget (``read_tool_budget_fraction`` of the window, in tokens) and
  ``read_tool_max_rounds`` allow; the last round is sent without the proxy's tools, so the
  model must answer;
- the proxy's tools *and* the client's in one response: the client's calls are returned (in
  streams they may already have been relayed), the proxy's calls are dropped unserved; the read
  tool stays offered, so the model can read on its next turn. Nothing is executed twice and the
  client never sees a tool it did not define.

In streams, tool-call deltas of the proxy's tools are removed and the client's calls renumbered
(``index`` 0..n-1) so SDK accumulators see a contiguous list; untouched events are relayed as
received.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class OwnCall:
    """A call to one of the proxy's tools, reassembled."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def as_tool_call(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": "".join(self.arguments)}
        return {"id": self.id, "type": "function", "function": function}


def split_calls(calls: list[dict[str, Any]] | None,
                own: frozenset[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(own_calls, client_calls)`` of a complete ``tool_calls`` list."""
    mine: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for call in calls or ():
        name = (call.get("function") or {}).get("name")
        (mine if name in own else theirs).append(call)
    return mine, theirs


class StreamToolFilter:
    """Removes the proxy's tool calls from ``chat.completion.chunk`` payloads (choice 0).

    ``filter(chunk)`` returns the chunk to send (the same object when untouched, a modified copy,
    or ``None`` to drop it). After the stream, ``own_calls`` holds the proxy's calls and
    ``client_calls`` counts the client's.
    """

    def __init__(self, own: frozenset[str]) -> None:
        self.own = own
        self._map: dict[int, int | None] = {}
        self._calls: dict[int, OwnCall] = {}
        self.client_calls = 0
        self.finish_reason: str | None = None

    @property
    def own_calls(self) -> list[OwnCall]:
        return [c for _, c in sorted(self._calls.items())]

    def filter(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        choices = chunk.get("choices")
        if not choices or not isinstance(choices, list):
            return chunk
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta") or {}
        calls = delta.get("tool_calls")
        if not calls:
            return chunk
        kept = []
        for call in calls:
            index = call.get("index", 0)
            name = (call.get("function") or {}).get("name")
            if index not in self._map:
                if name in self.own:
                    self._map[index] = None
                    self._calls[index] = OwnCall()
                else:
                    self._map[index] = self.client_calls
                    self.client_calls += 1
            target = self._map[index]
            if target is None:
                acc = self._calls[index]
                acc.id = call.get("id") or acc.id
                fn = call.get("function") or {}
                acc.name += fn.get("name") or ""
                if fn.get("arguments"):
                    acc.arguments.append(fn["arguments"])
            elif target == index:
                kept.append(call)
            else:
                kept.append(call | {"index": target})
        if len(kept) == len(calls) and all(k is c for k, c in zip(kept, calls, strict=True)):
            return chunk
        new_delta = {k: v for k, v in delta.items() if k != "tool_calls"}
        if kept:
            new_delta["tool_calls"] = kept
        if (not kept and not new_delta.get("content") and not choice.get("finish_reason") and len(choices) == 1
                and not chunk.get("usage")):
            return None
        return chunk | {"choices": [choice | {"delta": new_delta}, *choices[1:]]}
