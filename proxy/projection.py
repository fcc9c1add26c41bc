"""The projection: what is forwarded, as a pure function of the client's messages and stored events.

DESIGN.md section 3: ``forwarded = project(messages, events, profile, settings)``. Deterministic
(same input, byte-identical output: no clock, no randomness, ids from content hashes) and stable
across turns (a message once truncated, offloaded or summarized shows the same way next time).

Order of application (each step reads the previous one's output):

1. the deepest applicable ``summary`` event (anchor in the chain): leading system messages, then
   the summary ``user`` message at the place of the first summarized message, then the messages
   after the cutoff;
2. the deepest applicable ``truncate_args`` and ``media`` events (messages up to their boundary);
3. offload of large tool results / user messages (always, no event: a function of content);
4. planning, when the estimate is over the trigger (or ``force`` after an overflow): a
   ``TruncatePlan`` if truncation alone frees enough, else a ``SummaryPlan``; when nothing is left
   to summarize and the request is still too large, clip the trailing tool results in place;
5. signed parts left out of kept pieces an applied event changed the prefix of after they were
   made (``unsign``: Messages thinking is bound to the conversation before it; pieces made after
   the event, over the projected prefix, keep theirs);
6. synthetic answers for dangling tool calls (``patch_dangling_tool_calls``: by default only when
   another defense changed the request, so an untouched request is forwarded as sent, case 004).

Structure (roles and kinds, pairing groups, what is opaque) is read from the neutral model
(``proxy.conversation.model``): the items a codec gives for the pieces (``codec.items``; the caller
names the codec: chat, Messages, ...). The pieces themselves are rewritten only by the defenses'
part rewriters, which read and rewrite them through the same codec (its parts and their accessors)
and keep each piece's item (a truncated, offloaded or media-offloaded piece has the item it had); a
``sealed`` item (a signed Messages thinking turn) is never rewritten, only kept or summarized.
Step 4's choice of event is ``proxy.planner``'s (it reads this module's working state).

Counts are ``MessageCounter`` estimates memoized by message digest: unchanged messages reuse their
digest as key, changed ones are counted once under their new digest. Unchanged messages are shared
(not copied); when nothing applies, ``Projection.messages`` is the very list given.

State: ``ProjectionMemos`` (built by the caller, e.g. the compactor, and passed in) holds the
transform memo and the per-conversation prefix states (chain index, counts, items); without it a
projection memoizes nothing across calls (same result, slower).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import compress
from typing import Any

from proxy.cache import Memo
from proxy.conversation.canonical import message_digest
from proxy.conversation.codec import Codec
from proxy.conversation.model import Item, Piece
from proxy.conversation.prefix import PrefixState, PrefixStates
from proxy.defenses.config import DefenseConfig
from proxy.defenses.cutoff import last_user_turn, leading_system_count
from proxy.defenses.media import offload_media
from proxy.defenses.offload import ArtifactToStore, offload_message
from proxy.defenses.overflow_clip import clip_trailing_results
from proxy.defenses.pairs import patch_dangling
from proxy.defenses.plans import Plan
from proxy.defenses.summarize import summary_message
from proxy.defenses.truncate_args import truncate_message
from proxy.planner import Event, Planner, media_plan, truncate_tail
from proxy.tokens.protocol import MessageCounter, Tokenizer

REPLY_PRIMING_TOKENS = 3
"""Every reply is primed with ``<|start|>assistant<|message|>`` (OpenAI cookbook)."""
DEFENSE_ORDER = ("summary", "truncate_args", "offload", "media", "clip", "unsign", "patch_dangling")
TRANSFORM_MEMO_SIZE = 20_000
"""Transformed messages kept (truncated, offloaded, media-offloaded; one stub each): an unchanged
message is transformed once, not on every request that resends it (entries unused for
``proxy.cache.MEMO_IDLE_S`` leave)."""


_Hit = tuple[Piece, int, tuple[str, ...], tuple[ArtifactToStore, ...]]
"""A transform memo entry: (message, tokens, defense kinds, artifacts)."""


class ProjectionMemos:
    """What projections remember across calls; built by the projection's owner (the compactor,
    ``replay``) and passed to ``project``. Thread-safe (one lock, held for lookups and stores).

    ``transforms``: at most ``TRANSFORM_MEMO_SIZE`` transformed messages (key: the client
    message's digest, the flags, the config, the unavailable artifacts, the counter); entries unused
    for ``proxy.cache.MEMO_IDLE_S`` leave. ``prefixes``: the per-conversation prefix states
    (``proxy.conversation.prefix.PrefixStates``: chain index, counts, items; at most
    ``prefix.MAX_POSITIONS`` positions)."""

    def __init__(self, transform_size: int = TRANSFORM_MEMO_SIZE, prefixes: PrefixStates | None = None) -> None:
        self.transforms = Memo(transform_size)
        self.prefixes = prefixes if prefixes is not None else PrefixStates()
        self.lock = threading.Lock()

    def clear(self) -> None:
        """Forget everything (tests)."""
        with self.lock:
            self.transforms.clear()
        self.prefixes.clear()


def _items(state: PrefixState, codec: Codec, pieces: list[Piece]) -> list[Item]:
    """The model's items of ``pieces`` (``codec.items``), extending those ``state`` holds (a list
    kept in a state is never mutated: a longer prefix gets a new one)."""
    items = state.items
    if state.items_codec != codec.name or len(items) > len(pieces):
        items = []
    if len(items) < len(pieces):
        items = items + codec.items(pieces[len(items):])
        state.items, state.items_codec = items, codec.name
    return items


@dataclass(slots=True)
class Projection:
    """The result of ``project`` (not ``frozen``, yet never changed once built: one per request,
    and a frozen dataclass's fields cost about five times as much to set; see ``Prepared``).

    ``messages``: the list to forward (the input list itself when ``applied`` is empty).
    ``tokens_forwarded``/``tokens_client``: estimates of the whole prompt (messages + tool schemas +
    reserved output tokens) as forwarded / as the client sent it. ``applied``: defense names used,
    in ``DEFENSE_ORDER``. ``event_ids``: stored events applied. ``artifacts``: content to store
    BEFORE forwarding (stubs and plan inputs reference them). ``plan``: a new event to perform now,
    or ``None``. ``fits``: estimate <= window (``True`` for an unknown window).
    ``reason_unfittable``: why the request cannot fit by the estimate (refused only under a window
    the operator configured; otherwise forwarded, and the provider answers).
    """

    messages: list[Piece]
    tokens_forwarded: int
    tokens_client: int
    applied: tuple[str, ...]
    event_ids: tuple[str, ...]
    artifacts: tuple[ArtifactToStore, ...]
    plan: Plan | None
    fits: bool
    reason_unfittable: str | None


def _deepest(events: Sequence[Event], kind: str, index: Mapping[str, int]) -> tuple[Event, int] | None:
    best: tuple[Event, int] | None = None
    for ev in events:
        if ev.kind != kind:
            continue
        i = index.get(ev.anchor_hash)
        if i is not None and (best is None or i > best[1] or (i == best[1] and ev.id > best[0].id)):
            best = (ev, i)
    return best


class _Projector:
    """Working state of one projection (private; lives for one ``project`` call)."""

    def __init__(self, messages: list[Piece], items: Sequence[Item], digests: list[str], chain: list[str],
                 client_counts: list[int], cfg: DefenseConfig, counter: MessageCounter, unavailable: frozenset[str],
                 memos: ProjectionMemos, codec: Codec) -> None:
        self.messages, self.digests, self.chain, self.cfg, self.counter = messages, digests, chain, cfg, counter
        self.items, self.memos, self.codec = items, memos, codec
        self.client_counts, self.unavailable = client_counts, unavailable
        self.cur: list[Piece] = list(messages)
        self.counts: list[int] = list(client_counts)
        self.kinds: set[str] = set()
        self.artifacts: dict[str, ArtifactToStore] = {}
        self.min_offload_tokens = min(cfg.offload_tool_threshold_tokens, cfg.offload_user_tokens)
        """No message under this many tokens can be offloaded (no part of it can be over a threshold)."""

    def count_new(self, message: Piece) -> int:
        return self.counter.count_message(message, message_digest(message))

    def replace(self, i: int, piece: Piece) -> int:
        """Put ``piece`` in place of piece ``i`` (counted anew); the change in tokens."""
        count = self.count_new(piece)
        change, self.cur[i], self.counts[i] = count - self.counts[i], piece, count
        return change

    def transform(self, i: int, truncate: bool, media: bool, kinds: set[str]) -> tuple[Piece, int]:
        """Message ``i`` (from ``self.cur``) with truncation, media offload and offload applied.

        Memoized by the client message's digest, the flags, the config and the unavailable
        artifacts (the result is a function of those alone, and ``self.cur[i]`` is the client's
        message whenever this runs: summaries and clipping replace messages only later)."""
        m, cnt = self.cur[i], self.counts[i]
        if not truncate and not media and cnt <= self.min_offload_tokens:
            return m, cnt  # the common case, kept cheap: most messages are small and untouched
        if self.items[i].sealed:
            return m, cnt  # signed (a Messages thinking turn): kept or dropped whole, never rewritten
        if m is not self.messages[i]:
            out, n, arts = self._transform(i, truncate, media, kinds)
            self._collect(i, arts)
            return out, n
        # the counter is part of the key: another tokenizer counts (and offloads) differently
        key = (self.digests[i], truncate, media, self.cfg, self.unavailable,
               self.counter.encoding_name, self.counter.exact)
        memos = self.memos
        with memos.lock:
            hit: _Hit | None = memos.transforms.get(key)
        if hit is None:
            new_kinds: set[str] = set()
            # every artifact the stub names, not only those new to this request: a later hit (in
            # another session or tenant) must store all of them itself
            out, n, arts = self._transform(i, truncate, media, new_kinds)
            hit = (out, n, tuple(sorted(new_kinds)), arts)
            with memos.lock:
                memos.transforms.put(key, hit)
        out, n, new, arts = hit
        kinds.update(new)
        self._collect(i, arts)
        return out, n

    def _collect(self, i: int, arts: Sequence[ArtifactToStore]) -> None:
        """Note ``arts``, offloaded from message ``i``, as content to store, each naming that
        message as its ``source`` (a content offloaded from several: the last of them)."""
        self.artifacts.update((a.id, replace(a, source=self.chain[i])) for a in arts)

    def _transform(self, i: int, truncate: bool, media: bool,
                   kinds: set[str]) -> tuple[Piece, int, tuple[ArtifactToStore, ...]]:
        """Message ``i`` transformed, its tokens and the artifacts its stubs name (no ``source``:
        memoized by content, the result holds nothing of where the message sits)."""
        cfg = self.cfg
        m, cnt, changed = self.cur[i], self.counts[i], False
        found: dict[str, ArtifactToStore] = {}
        if truncate:
            t = truncate_message(m, cfg.truncate_args_tools, cfg.truncate_args_max_chars, cfg.truncate_args_keep_chars,
                                 item=self.items[i], codec=self.codec)
            if t is not None:
                m, changed = t, True
                kinds.add("truncate_args")
        if media:
            mm, arts = offload_media(m, self.unavailable, codec=self.codec)
            if mm is not None:
                m, changed = mm, True
                kinds.add("media")
                found.update((a.id, a) for a in arts)
        if changed:
            cnt = self.count_new(m)
        o, arts = offload_message(m, cnt, self.counter.count_text, cfg, self.unavailable, item=self.items[i],
                                  codec=self.codec)
        if o is not None:
            m, cnt = o, self.count_new(o)
            kinds.add("offload")
            found.update((a.id, a) for a in arts)
        return m, cnt, tuple(found.values())


def project(
    messages: list[Piece],
    digests: list[str],
    chain_hashes: list[str],
    events: Sequence[Event],
    config: DefenseConfig,
    counter: Tokenizer,
    session_id: str,
    codec: Codec,
    memos: ProjectionMemos | None = None,
    tools: list[dict[str, Any]] | None = None,
    reserved_output_tokens: int = 0,
    force: bool = False,
    force_media: bool = False,
    limit_override_tokens: int | None = None,
    unavailable_artifacts: frozenset[str] = frozenset(),
    truncate_first: bool = True,
    new_events: bool = True,
    escalate: bool = False,
) -> Projection:
    """Project the client's ``messages`` through the stored ``events`` and the defenses. (Every
    argument may be passed by position, in this order: a call naming its 17 arguments cost about
    0.7 us more than one passing them in order, timed, ``proxy.compaction.plan_loop``'s.)

    ``digests``/``chain_hashes``: from ``proxy.conversation.canonical.digests_and_chain(messages)``. ``events``:
    the session's ``storage.records.EventRecord``s (any order; an event applies iff its
    ``anchor_hash`` is in ``chain_hashes``). ``counter``: a ``proxy.tokens.protocol.Tokenizer``
    (``proxy.tokens.counter.TokenCounter``), bound to ``codec`` to count the pieces. ``memos``:
    what to remember across calls (the caller's ``ProjectionMemos``; ``None``: nothing, the same
    result). ``codec``: whose items describe the pieces (``messages``: chat messages, or another
    codec's pieces), and through which the part rewriters read and rewrite them.
    ``force``: an overflow happened, compact even below the trigger (pass it once per overflow:
    after storing the planned event, re-project with ``force=False``; a forced projection may
    plan a summary that keeps only the last turn; as over the trigger, old tool arguments are
    truncated first when that alone fits, unless ``truncate_first`` is false: the manual compaction
    tool asks for a summary); a tool cycle under way with signed turns (``signed_cycle``) plans
    no event (they were made over the prefix as it is) unless it does not fit the window: then a
    summary of all of it, its latest results included (``Planner.plan_whole``).
    ``escalate`` (with ``force``): the last retry came out as the attempt refused, so a signed
    cycle is summarized whole even when the estimate says it fits. ``new_events``: ``False`` plans
    none at all (the client's own compaction request: it is
    forwarded as it came, only its trailing results clipped if it does not fit). ``force_media``: a body-size
    overflow (413), plan offloading inline images of all but the newest user message.
    ``limit_override_tokens``: a window learned from an overflow error (the smaller window wins).
    ``unavailable_artifacts``: ids the pipeline failed to store; never referenced (the original
    content is forwarded instead; an image becomes an error placeholder). Pure: inputs are not
    mutated, no I/O. Raises nothing for well-formed chat messages.
    """
    cfg = config if limit_override_tokens is None else config.with_window(limit_override_tokens)
    window = cfg.context_window_tokens
    priced = counter.bind(codec)
    tools_tokens = priced.count_tools(tools)
    fixed = tools_tokens + reserved_output_tokens + REPLY_PRIMING_TOKENS
    if len(digests) != len(messages) or len(chain_hashes) != len(messages):
        raise ValueError(f"{len(messages)} messages but {len(digests)} digests and {len(chain_hashes)} chain hashes")
    if memos is None:
        memos = ProjectionMemos(0, PrefixStates(0))
    state = memos.prefixes.take(chain_hashes)
    try:
        client_counts = priced.count_history(messages, digests, chain_hashes, state)
        tokens_client = fixed + sum(client_counts)
        if not cfg.enabled or not messages:
            fits = window is None or tokens_client <= window
            return Projection(messages, tokens_client, tokens_client, (), (), (), None, fits, None)
        if (not events and not force and not force_media and tokens_client <= cfg.trigger_tokens
                and (window is None or tokens_client <= window) and cfg.patch_dangling_tool_calls != "always"
                and max(client_counts) <= min(cfg.offload_tool_threshold_tokens, cfg.offload_user_tokens)):
            # the shortcut: what ``_project`` finds then, without its working state: no event
            # applies, no message is big enough to offload, no compaction is due (most requests: a
            # third of a small request's projection, callgrind; ``tests/test_projection.py``
            # checks the two agree on the traces)
            return Projection(messages, tokens_client, tokens_client, (), (), (), None, True, None)
        return _project(messages, digests, chain_hashes, events, cfg, priced, session_id, window, fixed, tools_tokens,
                        reserved_output_tokens, client_counts, tokens_client, force, force_media,
                        unavailable_artifacts, truncate_first, new_events, escalate, state, memos, codec)
    finally:
        memos.prefixes.keep(chain_hashes, state)


def _project(messages: list[Piece], digests: list[str], chain_hashes: list[str], events: Sequence[Event],
             cfg: DefenseConfig, counter: MessageCounter, session_id: str, window: int | None, fixed: int,
             tools_tokens: int, reserved_output_tokens: int, client_counts: list[int], tokens_client: int,
             force: bool, force_media: bool, unavailable_artifacts: frozenset[str], truncate_first: bool,
             new_events: bool, escalate: bool, state: PrefixState, memos: ProjectionMemos,
             codec: Codec) -> Projection:
    """``project`` past its shortcut for a request with nothing to do (same arguments, the client's
    messages counted)."""
    items = _items(state, codec, messages)
    p = _Projector(messages, items, digests, chain_hashes, client_counts, cfg, counter, unavailable_artifacts,
                   memos, codec)
    n = len(messages)
    index = state.chain_index(chain_hashes) if events else {}
    lead = leading_system_count(items)
    sev = _deepest(events, "summary", index)
    tev = _deepest(events, "truncate_args", index)
    mev = _deepest(events, "media", index)
    first = lead
    c_prev = -1
    event_ids: list[str] = []
    applied: list[tuple[Event, int]] = []
    """The applied events, each with the last index of the pieces it rewrites (``-1``: a summary)."""
    if sev is not None:
        first = index.get(sev[0].payload.get("first_hash", ""), lead)
        c_prev = sev[1]
        if first > c_prev:
            first = lead
        event_ids.append(sev[0].id)
        applied.append((sev[0], -1))
    lo = c_prev + 1 if sev is not None else first
    t_bound = tev[1] if tev is not None else -1
    m_bound = mev[1] if mev is not None else -1
    if tev is not None and t_bound >= lo:
        event_ids.append(tev[0].id)
        applied.append((tev[0], t_bound))
    if mev is not None and m_bound >= lo:
        event_ids.append(mev[0].id)
        applied.append((mev[0], m_bound))
    bound = max(t_bound, m_bound)
    big = p.min_offload_tokens.__lt__  # only these can be offloaded past the event boundaries
    past = range(max(lo, bound + 1), n)
    todo = [*range(first), *range(lo, min(bound + 1, n)), *compress(past, map(big, p.counts[past.start:]))]
    for i in todo:
        p.cur[i], p.counts[i] = p.transform(i, i <= t_bound, i <= m_bound, p.kinds)

    summary_msg: Piece | None = None
    summary_tokens = 0
    if sev is not None:
        ev = sev[0]
        pinned_i = index.get(ev.payload.get("pinned_user_hash") or "")
        pinned = codec.user_text(messages[pinned_i]) if pinned_i is not None else None
        summary_msg = summary_message(
            ev.payload.get("summary", ""), session_id, ev.id,
            int(ev.payload.get("message_count") or (c_prev - first + 1)),
            pinned_user_text=pinned, read_tool_name=cfg.read_tool_name,
        )
        summary_tokens = p.count_new(summary_msg)
        p.kinds.add("summary")

    head_tokens = sum(p.counts[:first])
    total = fixed + head_tokens + summary_tokens + sum(p.counts[lo:])
    floor = fixed + head_tokens
    if window is not None and floor > window:
        reason = (
            f"tool schemas ({tools_tokens} tokens), reserved output tokens ({reserved_output_tokens}) and "
            f"system messages ({head_tokens} tokens) alone need {floor} tokens, over the model's context "
            f"window of {window} tokens; no compaction of the conversation can make this request fit"
        )
        return _finish(p, messages, first, lo, summary_msg, total, tokens_client, event_ids, None, window, reason)

    plan: Plan | None = None
    # a tool cycle under way with signed turns: they were made over the prefix as it is, so a new
    # event (which would rewrite it) waits for the cycle's end, unless the request does not fit
    # the window (then everything is summarized: ``Planner.plan_whole``)
    held = new_events and codec.binds_prefix and signed_cycle(items)
    if force_media and new_events:
        plan = media_plan(p, lo, m_bound, total)
    too_big = window is not None and total > window
    planner = Planner(p, first, lo, c_prev, t_bound, fixed + head_tokens, total, sev)
    if plan is None and new_events and not held and (force or too_big or total > cfg.trigger_tokens):
        plan = planner.plan(aggressive=force or too_big, allow_truncate=truncate_first or not force)
    if plan is None and held and ((window is not None and total > window)
                                  or (force and (escalate or _rewrites_signed(p, lo)))):
        # the last resort of a signed cycle that does not fit, or that the provider refused while
        # the retry rewrites what its signed turns were made over (a window learned from the
        # overflow offloads earlier results): a kept turn's thinking would be stale, so all of it
        # goes into the summary, the latest results included
        plan = planner.plan_whole()
    elif plan is None and (force or too_big) and not held:
        clipped, idx, arts = clip_trailing_results(
            p.cur[lo:], items[lo:], p.counts[lo:], cfg, counter.count_text, unavailable_artifacts, codec
        )
        if clipped is not None:
            for j in idx:
                p.replace(lo + j, clipped[j])
            for a in arts:  # (their source is left to the compactor to find: clipping names none)
                p.artifacts.setdefault(a.id, a)
            p.kinds.add("clip")
            total = fixed + head_tokens + summary_tokens + sum(p.counts[lo:])
        if window is not None and total > window:
            total += truncate_tail(p, lo)
    total += _unsign_stale(p, lo, applied, index)
    return _finish(p, messages, first, lo, summary_msg, total, tokens_client, event_ids, plan, window, None)


def _rewrites_signed(p: _Projector, lo: int) -> bool:
    """A kept piece before the last sealed one is forwarded other than the client sent it (what
    the sealed turns after it were made over may have been the client's own)."""
    last = max((j for j in range(lo, len(p.items)) if p.items[j].sealed), default=-1)
    return any(p.cur[i] is not p.messages[i] for i in range(lo, last))


def _made_through(ev: Event, chain: Sequence[str], index: Mapping[str, int], n: int) -> int:
    """The last index of the pieces of this chain made before ``ev`` was stored: its
    ``planned_at_hash``; on a branch that left the planning one after the anchor (a rewind), the
    last piece the two share (``made_before``, the short hashes after the anchor); ``n - 1``, all
    of them, when that cannot be told (an older event, a list cut short and no piece found)."""
    at = index.get(ev.payload.get("planned_at_hash") or "")
    if at is not None:
        return at
    made, anchor = ev.payload.get("made_before"), index.get(ev.anchor_hash)
    if not isinstance(made, list) or anchor is None:
        return n - 1
    known = {h for h in made if isinstance(h, str)}
    width = len(next(iter(known), ""))
    shared = [j for j in range(anchor + 1, n) if chain[j][:width] in known]
    if shared:
        return shared[-1]
    return anchor if ev.payload.get("made_before_complete") else n - 1


def signed_cycle(items: Sequence[Item]) -> bool:
    """The tool cycle under way (the items after the user's latest turn) holds a sealed item: a
    turn with content the provider signed against the prefix before it."""
    u = last_user_turn(items)
    return any(item.sealed for item in items[(u + 1 if u is not None else 0):])


def _unsign_stale(p: _Projector, lo: int, applied: Sequence[tuple[Event, int]], index: Mapping[str, int]) -> int:
    """Leave out the signed parts (``Codec.unsigned``: Messages thinking, which the API binds to the
    conversation before it) of the kept pieces whose prefix an applied event changed after they
    were made: those after the first piece an event rewrote (every kept piece, for a summary) and
    up to the last piece made before the event was stored (``_made_through``). Pieces made after
    the event keep theirs: the model made them over the projected prefix. The change in tokens
    (``<= 0``)."""
    n = len(p.cur)
    start, through = n, -1
    for ev, bound in applied:
        through = max(through, _made_through(ev, p.chain, index, n))
        if bound < 0:
            start = min(start, lo)
        else:  # after the first piece it rewrote (a sealed piece before that kept its prefix)
            changed = next((i for i in range(lo, min(bound, n - 1) + 1) if p.cur[i] is not p.messages[i]), None)
            if changed is not None:
                start = min(start, changed + 1)
    change = 0
    for j in range(start, through + 1):
        if not p.items[j].sealed:
            continue
        out = p.codec.unsigned(p.cur[j])
        if out is not None:
            change += p.replace(j, out)
            p.kinds.add("unsign")
    return change


def _finish(p: _Projector, messages: list[Piece], first: int, lo: int,
            summary_msg: Piece | None, total: int, tokens_client: int, event_ids: list[str],
            plan: Plan | None, window: int | None, reason: str | None) -> Projection:
    summary = [summary_msg] if summary_msg is not None else []
    out = p.cur[:first] + summary + p.cur[lo:]
    mode = p.cfg.patch_dangling_tool_calls
    if mode == "always" or (mode == "compacted" and p.kinds):
        # a rewritten piece keeps its item, so the output's items are the client's around the summary
        items = [*p.items[:first], *map(p.codec.item, summary), *p.items[lo:]]
        patched = patch_dangling(out, items, p.codec)
        if patched is not None:
            present = {id(m) for m in out}
            total += sum(p.counter.count_message(m) for m in patched if id(m) not in present)
            out = patched
            p.kinds.add("patch_dangling")
    if not p.kinds:
        out = messages
    fits = window is None or total <= window
    if reason is None and plan is None and not fits:
        reason = (
            f"after compaction the request still needs about {total} tokens, over the model's context "
            f"window of {window} tokens: the most recent messages alone do not fit"
        )
    applied = tuple(k for k in DEFENSE_ORDER if k in p.kinds)
    return Projection(out, total, tokens_client, applied, tuple(event_ids), tuple(p.artifacts.values()),
                      plan, fits, reason)
