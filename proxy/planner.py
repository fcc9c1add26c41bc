"""The planner: the next compaction event of a projection over the trigger, and its last resorts.

Reads a projection's working state (``Work``: ``proxy.projection``'s one per ``project`` call) and
decides: a ``TruncatePlan`` when truncating old tool arguments alone leaves room, else a
``SummaryPlan`` (pair-safe cut by ``proxy.defenses.cutoff``); a ``MediaPlan`` after a body-size
overflow (``media_plan``); and, when nothing is left to summarize, ``truncate_tail`` (the kept
tail's arguments). Pure: no I/O; only ``truncate_tail`` changes the state it is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from proxy.conversation.codec import Codec
from proxy.conversation.model import Item, Piece
from proxy.defenses.config import DefenseConfig
from proxy.defenses.cutoff import last_user_turn, tail_start
from proxy.defenses.media import offload_media
from proxy.defenses.plans import MediaPlan, Plan, SummaryPlan, TruncatePlan
from proxy.defenses.truncate_args import truncate_message


class Event(Protocol):
    """What the projection reads of a stored compaction event (``storage.records.EventRecord``)."""

    @property
    def id(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def anchor_hash(self) -> str: ...

    @property
    def payload(self) -> Mapping[str, Any]: ...


class Work(Protocol):
    """A projection's working state, as the planner reads it (``proxy.projection``'s ``_Projector``).

    ``messages``/``items``/``chain``/``client_counts``: the client's pieces, their items, chain
    hashes and token counts; ``cur``/``counts``: the pieces as projected so far and their counts
    (tokens); ``kinds``: the defense names applied so far; ``cfg``, ``codec``, ``unavailable``: as
    given to ``project``."""

    messages: list[Piece]
    items: Sequence[Item]
    chain: list[str]
    client_counts: list[int]
    cur: list[Piece]
    counts: list[int]
    kinds: set[str]
    cfg: DefenseConfig
    codec: Codec
    unavailable: frozenset[str]

    def count_new(self, message: Piece) -> int:
        """The token count of a piece the projection made."""
        ...

    def replace(self, i: int, piece: Piece) -> int:
        """Put ``piece`` in place of ``cur[i]`` (counted anew); the change in tokens."""
        ...

    def transform(self, i: int, truncate: bool, media: bool, kinds: set[str]) -> tuple[Piece, int]:
        """Piece ``i`` truncated/media-offloaded/offloaded, and its token count."""
        ...


def truncate_tail(p: Work, lo: int) -> int:
    """Last resort after clipping: truncate configured tools' arguments in the kept tail too.

    Those calls already ran (their files exist and can be re-read), so their long arguments are the
    cheapest thing left to cut. Returns the token delta (<= 0).
    """
    cfg, delta = p.cfg, 0
    for i in range(lo, len(p.cur)):
        if p.items[i].sealed:
            continue
        t = truncate_message(p.cur[i], cfg.truncate_args_tools, cfg.truncate_args_max_chars,
                             cfg.truncate_args_keep_chars, item=p.items[i], codec=p.codec)
        if t is not None:
            delta += p.replace(i, t)
            p.kinds.add("truncate_args")
    return delta


def media_plan(p: Work, lo: int, m_bound: int, total: int) -> MediaPlan | None:
    """Case 019: offload inline images of every kept message before the newest user message (the
    newest piece of role ``user``: a Messages turn of tool results, whose screenshots the model is
    looking at, is one)."""
    u = next((i for i in range(len(p.items) - 1, -1, -1) if p.items[i].role == "user"), None)
    boundary = (u if u is not None else len(p.messages)) - 1
    saved, found = 0, False
    for i in range(max(lo, m_bound + 1), boundary + 1):
        if p.items[i].sealed:
            continue
        new, _ = offload_media(p.cur[i], p.unavailable, codec=p.codec)
        if new is not None:
            found = True
            saved += p.counts[i] - p.count_new(new)
    if not found:
        return None
    return MediaPlan(p.chain[boundary], total, total - max(0, saved))


class Planner:
    """Chooses the next compaction event (truncation first, else a summary)."""

    def __init__(self, p: Work, first: int, lo: int, c_prev: int, t_bound: int,
                 base: int, total: int, sev: tuple[Event, int] | None) -> None:
        self.p, self.first, self.lo, self.c_prev, self.t_bound = p, first, lo, c_prev, t_bound
        self.base, self.total, self.sev = base, total, sev

    def plan(self, aggressive: bool, allow_truncate: bool) -> Plan | None:
        p, cfg = self.p, self.p.cfg
        c = tail_start(p.items, p.counts, self.lo, cfg.keep_tokens, cfg.keep_messages) - 1
        if c < self.lo and aggressive:
            c = tail_start(p.items, p.counts, self.lo, 0, None) - 1  # minimal tail: the last turn
        if c < self.lo:
            return None
        if allow_truncate:
            truncate = self._truncate(c)
            if truncate is not None:
                return truncate
        replaced = sum(p.counts[self.lo:c + 1]) + self.total - self.base - sum(p.counts[self.lo:])
        if replaced <= cfg.summary_estimate_tokens:
            return None  # the summary would not be smaller than what it replaces: clip instead
        return self._summary(c)

    def _truncate(self, c: int) -> TruncatePlan | None:
        """Truncation alone, if it frees enough to leave ``keep_tokens`` of room under the trigger.

        A truncation that leaves less room would be redone within a few turns (churning the
        prompt prefix); a summary then makes the larger step.
        """
        p, cfg = self.p, self.p.cfg
        if c <= self.t_bound:
            return None
        saved = 0
        for i in range(max(self.lo, self.t_bound + 1), c + 1):
            if p.items[i].sealed:
                continue
            t = truncate_message(p.cur[i], cfg.truncate_args_tools, cfg.truncate_args_max_chars,
                                 cfg.truncate_args_keep_chars, item=p.items[i], codec=p.codec)
            if t is not None:
                saved += p.counts[i] - p.count_new(t)
        after = self.total - saved
        if saved > 0 and after <= cfg.trigger_tokens - (cfg.keep_tokens or 0):
            return TruncatePlan(p.chain[c], self.total, after)
        return None

    def plan_whole(self) -> SummaryPlan | None:
        """A summary of everything after the leading system pieces and the applied summary, the
        latest turn and its results included (``None``: nothing there): the last resort of a tool
        cycle whose turns are signed against their prefix (``proxy.projection.signed_cycle``), which
        no kept tail could keep once the prefix changes. Pinned (verbatim in the summary message,
        when small): the text the last turn carries beside its results (what the user or the client
        said last: a question, a reminder), else the user's latest request."""
        c = len(self.p.items) - 1
        return self._summary(c, whole=True) if c >= self.lo else None

    def _summary(self, c: int, *, whole: bool = False) -> SummaryPlan:
        p, cfg = self.p, self.p.cfg
        est_summary = cfg.summary_estimate_tokens
        pinned: int | None = None
        u = last_user_turn(p.items)
        if whole:
            last = len(p.items) - 1
            said = p.codec.user_text(p.messages[last]).strip() if p.items[last].role == "user" else ""
            size = p.count_new({"role": "user", "content": said}) if said else None
            u = last if said else u  # (its results go into the summary; what it says stays verbatim)
            if u is not None and self.first <= u <= c and (
                    size if size is not None else p.client_counts[u]) <= (cfg.keep_tokens or 2000):
                pinned = u
        elif u is not None and self.first <= u <= c:
            # Cut before the user's latest request instead (a user turn is never a tool answer, so
            # that cut is pair-safe) when it keeps at most one more keep budget: a big step still.
            c2 = u - 1
            extra_ok = (sum(p.counts[c2 + 1:c + 1]) <= cfg.keep_tokens if cfg.keep_tokens is not None
                        else c - c2 <= (cfg.keep_messages or 0))
            if c2 >= self.lo and extra_ok:
                c = c2
            elif p.client_counts[u] <= (cfg.keep_tokens or 2000):
                pinned = u
        to_summarize: list[Piece] = []
        scratch: set[str] = set()
        for i in range(self.lo, c + 1):
            m, _ = p.transform(i, True, True, scratch)  # summarized history: media become references
            to_summarize.append(m)
        pinned_tokens = p.client_counts[pinned] if pinned is not None else 0
        after = self.base + est_summary + pinned_tokens + sum(p.counts[c + 1:])
        sev = self.sev
        return SummaryPlan(
            anchor_hash=p.chain[c],
            first_hash=p.chain[self.first],
            first_index=self.first,
            cutoff_index=c,
            previous_summary=sev[0].payload.get("summary") if sev else None,
            previous_event_id=sev[0].id if sev else None,
            to_summarize=to_summarize,
            tokens_before=self.total,
            tokens_after_estimate=after,
            pinned_user_hash=p.chain[pinned] if pinned is not None else None,
        )
