"""The whole-answer path of the Messages use case (``proxy.forward.messages``): a Message read
whole (not a stream, or an error status). ``own_calls``: an answer to a request that offered the
proxy's read tool, served and asked again when it called only that tool, else returned with the
proxy's calls removed and this request's earlier rounds' blocks first
(``proxy.conversation.messages_rounds``). ``finish_whole``: the answer logged (its ``content`` as
the reply, its ``usage`` and ``stop_reason``).
"""

from __future__ import annotations

from typing import Any

from proxy.conversation.messages_codec import reply_view, round_view
from proxy.conversation.messages_rounds import as_calls, merged, split_uses, without
from proxy.forward.context import ChatContext
from proxy.forward.log_writer import LogWriter
from proxy.forward.messages_tools import has_text
from proxy.forward.tool_rounds import ToolRounds
from proxy.json_depth import DEEP_REPLY_ERROR, dumps
from proxy.json_text import parse_json


async def own_calls(ctx: ChatContext, data: bytes, tools: ToolRounds) -> tuple[bytes, dict[str, Any] | None] | None:
    """A whole answer of a request that offered the proxy's tool: ``None`` when it called only
    that tool and a round served it (``tools``; ask again); else ``(answer, message)``: the answer
    to return, the proxy's calls removed and earlier rounds' blocks first (``data`` itself when
    nothing changes), and the Message it holds as read (``None`` when ``data`` is not one), for
    ``finish_whole`` to log without reading it again. Raises ``UpstreamError`` (502
    ``unserved_tool_call``) for an answer of nothing but unservable calls."""
    assert ctx.prepared is not None
    try:
        message = parse_json(data)
    except ValueError:
        return data, None
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return data, None
    mine, theirs = split_uses(message["content"], ctx.prepared.own_tools)
    if tools.serves(ctx, mine, theirs):
        await tools.serve(ctx, round_view({"role": "assistant", "content": message["content"]}), as_calls(mine))
        return None
    if not mine and not ctx.internal:
        return data, message
    content = without(message["content"], mine)
    if mine and not theirs:
        tools.unserved(ctx, as_calls(mine), has_text=has_text(content))
        if message.get("stop_reason") == "tool_use":
            message["stop_reason"] = "end_turn"
    message["content"] = merged(ctx.internal, content)
    return dumps(message), message


def finish_whole(ctx: ChatContext, status: int, data: bytes, writer: LogWriter, *, shared_key: bool,
                 message: dict[str, Any] | None = None) -> None:
    """Log a complete answer: the Message's ``content`` as the reply, its ``usage`` and
    ``stop_reason`` (``writer``; queued once the answer, returned next, is out:
    ``LogWriter.finish``'s ``after_answer``); an error status with the provider's text; a 401/403
    to the client's own key (not ``shared_key``, the operator's) logs the record only (``ctx.refused``).
    ``message``: the Message ``data`` holds, when the caller has read it (``own_calls``: equal to
    reading ``data`` again), else ``data`` is read here."""
    if status >= 400:
        ctx.refused = status in (401, 403) and not shared_key
        error = (f"the upstream refused the client's key ({status})" if ctx.refused
                 else data[:500].decode("utf-8", "replace"))
        writer.finish(ctx, status, None, None, error=error, after_answer=True)
        return
    if message is None:
        try:
            message = parse_json(data)
        except ValueError:
            message = None
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        writer.finish(ctx, status, None, None, error="the upstream's answer is not a Message", after_answer=True)
        return
    usage = message.get("usage") if isinstance(message.get("usage"), dict) else None
    stop = message.get("stop_reason") if isinstance(message.get("stop_reason"), str) else None
    reply = reply_view({"role": "assistant", "content": message["content"]})
    if reply is None:  # deep content past the request's budget: logged without it
        writer.finish(ctx, status, None, usage, error=DEEP_REPLY_ERROR, finish_reason=stop, after_answer=True)
        return
    writer.finish(ctx, status, reply, usage, finish_reason=stop, after_answer=True)
