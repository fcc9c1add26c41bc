"""A test-only sketch of an OpenAI Responses codec: its ``input`` items fit the model, the
unchanged projection plans over them without cutting a ``reasoning`` item (with
``encrypted_content``) from the item after it, nor a ``function_call`` from its output, and the
unchanged part rewriters (truncate arguments, offload, media) rewrite its pieces through it: a
``function_call`` item's ``arguments`` string, a ``function_call_output``'s ``output``,
``input_text``/``input_image`` parts (``tests/conversation/test_rewrites_by_codec.py`` runs them)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from proxy.conversation.canonical import digests_and_chain
from proxy.conversation.codec import PartCounter, ToolCall
from proxy.conversation.model import (
    ASSISTANT,
    BINDS_NEXT,
    BINDS_NONE,
    BINDS_PREVIOUS,
    CALL,
    CANCELLED_TEXT,
    MEDIA,
    OPAQUE,
    OPAQUE_PART,
    OTHER,
    SYSTEM,
    TEXT,
    TOOL,
    TOOL_CALL,
    TOOL_RESULT,
    USER,
    Item,
    Part,
    Piece,
    group_start,
)
from proxy.conversation.pricing import price_message, price_part, tool_schemas
from proxy.defenses.config import DefenseConfig
from proxy.defenses.pairs import dangling_calls
from proxy.defenses.plans import SummaryPlan
from proxy.projection import ProjectionMemos, project
from proxy.tokens.counter import TokenCounter
from tests.defenses.helpers import fabricate_event

_ROLE_KINDS = {"user": USER, "assistant": ASSISTANT, "system": SYSTEM, "developer": SYSTEM}


_TEXT_PARTS = frozenset({"input_text", "output_text"})


class ResponsesSketch:
    """Just enough of a codec for the projection and the part rewriters: pieces, items, parts and
    their accessors, answers (no apply: the route is issue 19's)."""

    name = "responses-sketch"
    binds_prefix = False  # (encrypted reasoning is bound to its own item, not to what came before)

    def pieces(self, body: Mapping[str, Any]) -> list[Piece]:
        items = body.get("input")
        out: list[Piece] = list(items) if isinstance(items, list) else [{"role": "user", "content": items}]
        if isinstance(body.get("instructions"), str):
            out.insert(0, {"role": "developer", "content": body["instructions"]})
        return out

    def item(self, piece: Piece) -> Item:
        kind = piece.get("type", "message")
        if kind == "message":
            return Item(_ROLE_KINDS.get(piece.get("role", ""), OPAQUE), piece.get("role"))
        if kind == "reasoning" and "encrypted_content" in piece:
            return Item(OPAQUE, kind, binds=BINDS_NEXT, sealed=True)
        if kind == "function_call":
            return Item(CALL, kind, calls=(piece["call_id"],))
        if kind == "function_call_output":
            return Item(TOOL, kind, answers=(piece["call_id"],), is_answer=True, binds=BINDS_PREVIOUS)
        return Item(OPAQUE, kind, binds=BINDS_PREVIOUS)

    def items(self, pieces: Sequence[Piece]) -> list[Item]:
        out = [self.item(p) for p in pieces]
        for i in range(1, len(out)):  # parallel calls: a call right after a call is in its group
            if out[i].kind == CALL and out[i - 1].kind == CALL:
                out[i] = out[i]._replace(binds=BINDS_PREVIOUS)
        return out

    def price(self, piece: Piece, counter: PartCounter) -> int:
        return price_message(piece, counter)

    def tool_schemas(self, tools: list[Any]) -> list[object]:
        return tool_schemas(tools)

    def parts(self, piece: Piece, counter: PartCounter) -> list[Part]:
        """A message: its string content (one ``TEXT`` part) or one part per content element
        (``input_text``/``output_text``: ``TEXT``; ``input_image``: ``MEDIA``). A ``function_call``:
        one ``TOOL_CALL`` part (the item itself); a ``function_call_output``: its ``output`` string
        (``TOOL_RESULT``); ``reasoning``: ``OPAQUE``."""
        kind = piece.get("type", "message")
        if kind == "function_call":
            return [Part(TOOL_CALL, price_part(piece, counter), piece, piece.get("call_id"), "item")]
        if kind == "function_call_output":
            output = piece.get("output")
            cost = counter.count_text(output) if isinstance(output, str) else price_part(output, counter)
            return [Part(TOOL_RESULT, cost, output, piece.get("call_id"), "output")]
        if kind != "message":
            return [Part(OPAQUE_PART, price_part(piece, counter), piece, None, "item")]
        content = piece.get("content")
        if isinstance(content, str):
            return [Part(TEXT, counter.count_text(content), content)]
        out = []
        for part in content if isinstance(content, list) else []:
            ptype = part.get("type") if isinstance(part, dict) else None
            pkind = TEXT if ptype in _TEXT_PARTS else MEDIA if ptype == "input_image" else OTHER
            out.append(Part(pkind, price_part(part, counter), part))
        return out

    def part_text(self, part: Part) -> str | None:
        native = part.native
        if isinstance(native, str):
            return native
        if isinstance(native, dict) and native.get("type") in _TEXT_PARTS and isinstance(native.get("text"), str):
            return cast(str, native["text"])
        return None

    def with_text(self, part: Part, text: str) -> object:
        if self.part_text(part) is None:
            raise ValueError("no text")
        return text if isinstance(part.native, str) else {**cast(dict[str, Any], part.native), "text": text}

    def tool_call(self, part: Part) -> ToolCall | None:
        native = part.native
        if part.kind != TOOL_CALL or not isinstance(native, dict):
            return None
        return ToolCall(native.get("name"), native.get("arguments"))

    def with_arguments(self, part: Part, arguments: object) -> object:
        return {**cast(dict[str, Any], part.native), "arguments": arguments}

    def inline_media(self, part: Part) -> tuple[str, str] | None:
        native = part.native
        url = native.get("image_url") if isinstance(native, dict) and native.get("type") == "input_image" else None
        if isinstance(url, str) and url.startswith("data:"):
            return url, url[5:].split(";", 1)[0].split(",", 1)[0] or "application/octet-stream"
        return None

    def text_part(self, text: str) -> object:
        return {"type": "input_text", "text": text}

    def with_parts(self, piece: Piece, new: Mapping[int, object]) -> Piece:
        if not new:
            return piece
        kind = piece.get("type", "message")
        if kind == "function_call":
            return cast(Piece, new[0])
        if kind == "function_call_output":
            return {**piece, "output": new[0]}
        content = piece.get("content")
        if isinstance(content, str):
            return {**piece, "content": new[0]}
        replaced = list(content)
        for i, value in new.items():
            replaced[i] = value
        return {**piece, "content": replaced}

    def render_part(self, piece: Piece, part: Part) -> str | None:
        if part.kind == TOOL_CALL:
            return f"-> tool call {piece.get('name')} (id {part.call_id}): {piece.get('arguments')}"
        if part.kind == OPAQUE_PART:
            return f"[{piece.get('type')}: opaque, not shown]"
        if part.kind == MEDIA:
            url = str(cast(dict[str, Any], part.native).get("image_url"))
            return f"[image: inline data, {len(url)} chars]" if url.startswith("data:") else f"[image: {url}]"
        text = self.part_text(part)
        return text if text is not None else json.dumps(part.native, sort_keys=True)

    def transcript_frame(self, piece: Piece) -> tuple[str, list[str]]:
        kind = piece.get("type", "message")
        if kind == "message":
            return str(piece.get("role")), []
        if kind == "function_call_output":
            return f"tool [answer to call {piece.get('call_id')}]", []
        return str(kind), []

    def text_piece(self, piece: Piece, text: str) -> Piece:
        if piece.get("type") == "function_call_output":
            return {"type": "function_call_output", "call_id": piece.get("call_id"), "output": text}
        return {"type": "message", "role": piece.get("role", "assistant"), "content": text}

    def user_text(self, piece: Piece) -> str:
        content = piece.get("content")
        if isinstance(content, str):
            return content
        texts = [p.get("text") for p in content or [] if isinstance(p, dict) and p.get("type") == "input_text"]
        return "\n".join(t for t in texts if isinstance(t, str))

    def inner_media(self, part: Part) -> list[tuple[int, str, str]]:
        return []

    def with_inner(self, part: Part, new: Mapping[int, object]) -> object:
        raise ValueError("no inner parts")

    def unsigned(self, piece: Piece) -> Piece | None:
        return None  # (a ``reasoning`` item is a piece of its own, bound to the next)

    def insert_answers(self, pieces: list[Piece], found: list[tuple[int, list[str]]], text: str) -> list[Piece]:
        out = list(pieces)
        for at, ids in reversed(found):
            out[at:at] = [{"type": "function_call_output", "call_id": cid, "output": text} for cid in ids]
        return out


SKETCH = ResponsesSketch()


def _input(steps: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Refactor the parser."}]
    for k in range(steps):
        items += [
            {"type": "reasoning", "id": f"rs_{k}", "summary": [], "encrypted_content": "gAAAA" + "x" * 200},
            {"type": "function_call", "call_id": f"a{k}", "name": "read_file", "arguments": '{"path": "p.py"}'},
            {"type": "function_call", "call_id": f"b{k}", "name": "read_file", "arguments": '{"path": "q.py"}'},
            {"type": "function_call_output", "call_id": f"a{k}", "output": f"line {k}\n" * 300},
            {"type": "function_call_output", "call_id": f"b{k}", "output": f"line {k}\n" * 300},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"Step {k} done."}]},
        ]
    return items


def test_responses_items_fit_the_model() -> None:
    pieces = SKETCH.pieces({"instructions": "Be brief.", "input": _input(1)})
    items = SKETCH.items(pieces)
    assert [i.kind for i in items] == [SYSTEM, USER, OPAQUE, CALL, CALL, TOOL, TOOL, ASSISTANT]
    assert items[2].binds == BINDS_NEXT and items[3].binds == BINDS_NONE and items[4].binds == BINDS_PREVIOUS
    for i in (3, 4, 5, 6):
        assert group_start(items, i) == 2  # reasoning, its calls and their outputs: one group
    assert dangling_calls(items) == []
    assert dangling_calls(items[:6]) == [(6, ["b0"])]


def test_the_projection_plans_over_responses_items_without_splitting_their_groups() -> None:
    counter = TokenCounter("o200k_base")
    pieces = SKETCH.pieces({"instructions": "Be brief.", "input": _input(8)})
    digests, chain = digests_and_chain(pieces)
    memos = ProjectionMemos()
    kw: dict[str, Any] = {"digests": digests, "chain_hashes": chain, "counter": counter, "session_id": "s",
                          "memos": memos, "codec": SKETCH}
    whole = project(pieces, events=[], config=DefenseConfig(context_window_tokens=10_000_000), **kw)
    cfg = DefenseConfig(context_window_tokens=int(whole.tokens_client / 0.85 * 0.9))
    plan = project(pieces, events=[], config=cfg, **kw).plan
    assert isinstance(plan, SummaryPlan)
    items = SKETCH.items(pieces)
    assert group_start(items, plan.cutoff_index + 1) == plan.cutoff_index + 1  # a group boundary
    p = project(pieces, events=[fabricate_event(plan)], config=cfg, **kw)
    assert p.plan is None and "summary" in p.applied
    kept = p.messages[2:]
    assert kept[0].get("type") in ("reasoning", "message")
    for i, piece in enumerate(kept):
        if piece.get("type") == "reasoning":
            assert kept[i + 1].get("type") == "function_call"  # never the last of what is kept
        if piece.get("type") == "function_call_output":
            calls = [q["call_id"] for q in kept[:i] if q.get("type") == "function_call"]
            assert piece["call_id"] in calls
    assert all(piece.get("output") != CANCELLED_TEXT for piece in p.messages)
