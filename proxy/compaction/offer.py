"""Which of the proxy's own tools (the read tool, the manual compaction tool) a request carries.

Offered: the read tool when ``Settings.read_tool_enabled``, the compaction tool when the client
asked for it (``X-Context-Proxy-Compact-Tool``); never under a name of the client's own tools, and
none at all with ``tool_choice: "none"`` (Anthropic's ``{"type": "none"}``). On Anthropic Messages
(``shape="messages"``) the read tool goes in Anthropic's tool shape and the compaction tool is not
offered (its header is a chat opt-in). Sent: the compaction tool whenever offered, the read tool
only when the forwarded messages name stored content (``proxy.compaction.references``). Never
the read budget: a tool list that changes between a session's requests invalidates the provider's
prompt cache, so a read call made with no budget left is answered in one last round
(``proxy.forward.tool_rounds.BUDGET_SPENT``), not prevented by leaving the tool out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.compaction.references import StoredContent
from proxy.settings import Settings
from proxy.tools.schemas import compact_tool_schema, messages_tool, read_tool_schema


@dataclass(frozen=True, slots=True)
class Offer:
    """The proxy's tools one request may carry: ``names[i]`` is the function name of ``schemas[i]``
    (``ValueError`` when their lengths differ: checked once here, so the requests' ``zip`` of them
    needs no ``strict``, whose keyword argument cost a call more than ``zip`` itself)."""

    names: tuple[str, ...] = ()
    schemas: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if len(self.names) != len(self.schemas):
            raise ValueError(f"an offer of {len(self.names)} names and {len(self.schemas)} schemas")

    def has(self, name: str) -> bool:
        return name in self.names


NO_OFFER = Offer()
"""None of the proxy's tools (``tool_choice: "none"``, a client's own compaction request)."""


class OwnToolOffer:
    """Decides the proxy's tools per request; one per compactor (or replay). State: the two
    schemas, built once (one object each, shared by every request that carries it: never
    mutated), and the ``StoredContent`` it is given (bounded there)."""

    def __init__(self, settings: Settings, stored: StoredContent, *, shape: str = "chat") -> None:
        self.settings = settings
        self.shape = shape
        """``chat`` (OpenAI function tools) or ``messages`` (Anthropic tools: ``name`` at the top)."""
        self.stored = stored
        read = read_tool_schema(settings.read_tool_name)
        self.read_schema = messages_tool(read) if shape == "messages" else read
        self.compact_schema = compact_tool_schema(settings.compact_tool_name)
        self._toolless = (self._offer(set(), False), self._offer(set(), True))
        """The offers of a request without tools or ``tool_choice`` (most), by ``compact_tool``."""

    def name_of(self, tool: Mapping[str, Any]) -> Any:
        """A tool's name in this offer's shape (``None`` for a tool without one)."""
        if self.shape == "messages":
            return tool.get("name")
        function = tool.get("function")
        return function.get("name") if isinstance(function, dict) else None

    def offerable(self, body: Mapping[str, Any], compact_tool: bool) -> Offer:
        """The tools this request may carry (the client's tool names never shadowed)."""
        choice = body.get("tool_choice")
        tools = body.get("tools")
        if choice is None and not tools:
            return self._toolless[compact_tool]  # (built once: what the lines below build for it)
        if choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none"):
            return NO_OFFER
        return self._offer({self.name_of(t) for t in tools or () if isinstance(t, dict)}, compact_tool)

    def _offer(self, client: set[Any], compact_tool: bool) -> Offer:
        """The proxy's tools not named in ``client`` (the client's tool names)."""
        names: list[str] = []
        schemas: list[dict[str, Any]] = []
        s = self.settings
        if s.read_tool_enabled and s.read_tool_name not in client:
            names.append(s.read_tool_name)
            schemas.append(self.read_schema)
        if compact_tool and self.shape == "chat" and s.compact_tool_name not in client:
            names.append(s.compact_tool_name)
            schemas.append(self.compact_schema)
        return Offer(tuple(names), tuple(schemas))

    def expected(self, offer: Offer, has_events: bool, raw: bytes, messages: Sequence[dict[str, Any]],
                 chain: Sequence[str], expanded: bool) -> list[dict[str, Any]]:
        """The schemas counted against the window before projecting: the read tool's when stored
        content may be named (the session has events, or the client's messages may name it)."""
        read = self.settings.read_tool_name
        return [schema for name, schema in zip(offer.names, offer.schemas)  # noqa: B905  (one length: ``Offer``)
                if name != read or has_events or self.stored.may_be_named(raw, messages, chain, expanded)]

    def chosen(self, offer: Offer, raw: bytes, messages: list[dict[str, Any]], chain: Sequence[str], expanded: bool,
               forwarded: list[dict[str, Any]], applied: Sequence[str]) -> list[dict[str, Any]]:
        """The schemas to append to ``tools``: the read tool's only when the forwarded messages
        name stored content (``StoredContent.named``)."""
        out = []
        for name, schema in zip(offer.names, offer.schemas):  # noqa: B905  (one length: ``Offer``)
            if name == self.settings.read_tool_name and not self.stored.named(raw, messages, chain, expanded,
                                                                               forwarded, applied):
                continue
            out.append(schema)
        return out
