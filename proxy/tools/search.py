"""Search in stored content for the read tool (issue 17): matching lines, ranked, with context.

A query is words (a line matches when it contains at least one of them, case-insensitive; lines
with more of the words rank first) or, with ``regex``, one pattern (case-insensitive) run by RE2
(``google-re2``): linear time in the text searched, whatever the pattern, and compiled within
``REGEX_MAX_MEM`` bytes (a pattern that needs more, or nests counted repeats past RE2's limit of
1000, is refused with a short text for the model). Lines are those of ``split_lines`` (a line over
``SEGMENT_CHARS`` characters is read as consecutive segments), the same numbering the tool reads
by, so a match's line number is the ``offset`` to read around it.

A search streams: ``Searcher.feed`` takes the lines of one item at a time (an archive page by
page), keeps only the best ``keep`` matches (a heap) with their context lines (a few previous lines
in a small buffer), so memory is about ``keep`` matches whatever the size searched. It stops at a
``deadline`` (monotonic seconds; the caller shares one over all the calls of a round) and says so.

Ranking: more query words matched first, then most recent (a later source, then a later line).
The rendering is at most ``max_chars`` characters and ends with how to get more.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import re2

SEGMENT_CHARS = 2000
"""Lines longer than this are read as consecutive segments of this many characters, each counted
as one line, so a single 100k-character line (minified JSON) can be read in parts too."""
MAX_QUERY_CHARS = 200
"""Longest query or pattern accepted (characters)."""
MAX_WORDS = 12
"""Words of a query used (the rest ignored, said in the result)."""
REGEX_MAX_MEM = 8 << 20
"""Memory RE2 may use for one compiled pattern (bytes); a pattern that needs more is refused."""
SEARCH_BUDGET_S = 2.0
"""Wall time one search may take by default (seconds); it stops there and says so."""
CONTEXT_LINES = 2
"""Lines of context shown before and after each match."""
MATCH_CHARS = 600
"""Characters of a matching line shown (a window around the first match)."""
CONTEXT_CHARS = 200
"""Characters of a context line shown."""
DEFAULT_MATCHES = 20
"""Matches a search lists by default (its ``limit``); at most ``MAX_MATCHES``."""
MAX_MATCHES = 200
MAX_SEARCH_OFFSET = 2000
"""Highest match ``offset`` a search pages to (matches kept in memory are at most this plus the limit)."""


def split_lines(text: str) -> list[str]:
    """``text``'s lines, each over ``SEGMENT_CHARS`` characters split into segments of that many."""
    out: list[str] = []
    for line in text.splitlines():
        if len(line) <= SEGMENT_CHARS:
            out.append(line)
        else:
            out.extend(line[i : i + SEGMENT_CHARS] for i in range(0, len(line), SEGMENT_CHARS))
    return out


@dataclass(frozen=True, slots=True)
class Source:
    """One searchable item: its reference as the model passes it, and its lines."""

    reference: str
    lines: Sequence[str]


class Match(Protocol):
    """What ``Searcher`` reads of a regex match: where it starts (characters)."""

    def start(self) -> int: ...


class Pattern(Protocol):
    """A compiled RE2 pattern (``re2`` ships no types): ``search`` is all the search uses."""

    def search(self, text: str) -> Match | None: ...


@dataclass(frozen=True, slots=True)
class Query:
    """A checked query: lower-cased words, or a compiled RE2 pattern. ``dropped``: words ignored."""

    text: str
    words: tuple[str, ...] = ()
    pattern: Pattern | None = None
    dropped: int = 0


def _options() -> object:
    """RE2's options: ``REGEX_MAX_MEM`` bytes, case-insensitive, nothing logged."""
    options = re2.Options()
    options.max_mem = REGEX_MAX_MEM
    options.case_sensitive = False
    options.log_errors = False  # the pattern is the model's text: it never reaches the logs
    return options


def compile_query(text: str, is_regex: bool) -> Query | str:
    """The query, or a short error text for the model (too long, empty, a pattern RE2 refuses:
    bad syntax, back-references, a repeat count over 1000, more than ``REGEX_MAX_MEM`` bytes).
    Bounded in time and memory: RE2 compiles within its memory cap."""
    text = text.strip()
    if not text:
        return "[context-proxy] 'query' is empty; pass words to search for."
    if len(text) > MAX_QUERY_CHARS:
        return f"[context-proxy] 'query' is longer than {MAX_QUERY_CHARS} characters; pass fewer words."
    if is_regex:
        try:
            return Query(text, pattern=re2.compile(text, _options()))
        except MemoryError:
            return "[context-proxy] The regex is too large to run; use a simpler pattern or plain words."
        except (re2.error, ValueError, OverflowError, RecursionError, TypeError) as exc:
            reason = exc.args[0] if exc.args else ""
            reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
            return f"[context-proxy] The regex does not compile ({reason[:120]}); fix it or search for plain words."
    words = tuple(dict.fromkeys(w.lower() for w in text.split()))
    return Query(text, words=words[:MAX_WORDS], dropped=max(0, len(words) - MAX_WORDS))


def _window(line: str, start: int, chars: int) -> str:
    if len(line) <= chars:
        return line
    begin = max(0, min(start - chars // 4, len(line) - chars))
    return ("…" if begin else "") + line[begin : begin + chars] + ("…" if begin + chars < len(line) else "")


@dataclass(slots=True)
class Hit:
    """A match kept: its rank key, the shown text (windowed) and its context lines ``(n, text)``."""

    score: int
    source: int
    line: int
    reference: str
    text: str
    before: list[tuple[int, str]]
    after: list[tuple[int, str]] = field(default_factory=list)

    def key(self) -> tuple[int, int, int]:
        return (self.score, self.source, self.line)


class Searcher:
    """A streaming top-``keep`` search (see the module docstring). Feed sources oldest first,
    each source's lines in order (possibly in several batches); then ``render``. CPU-bound: call
    ``feed`` in a thread for big batches."""

    def __init__(self, query: Query, keep: int, deadline: float | None = None) -> None:
        self.query = query
        self.keep = max(1, keep)
        self.deadline = time.monotonic() + SEARCH_BUDGET_S if deadline is None else deadline
        self.total = 0
        self.stopped = False
        self.sources = 0
        self.single: str | None = None
        self._heap: list[tuple[tuple[int, int, int], Hit]] = []
        self._source = -1
        self._before: deque[tuple[int, str]] = deque(maxlen=CONTEXT_LINES)
        self._pending: list[Hit] = []

    def _match(self, line: str) -> tuple[int, int] | None:
        """``(score, start)`` of a matching line, else ``None``."""
        if self.query.pattern is not None:
            m = self.query.pattern.search(line)
            return None if m is None else (1, m.start())
        low = line.lower()
        found = [i for i in (low.find(w) for w in self.query.words) if i >= 0]
        return (len(found), min(found)) if found else None

    def feed(self, source: int, reference: str, lines: Iterable[str], first: int = 0) -> bool:
        """Search ``lines`` (numbered from ``first``) of source number ``source``. ``False`` once
        the deadline passed (the search stopped; later feeds do nothing)."""
        if self.stopped:
            return False
        if source != self._source:
            self._source = source
            self._before.clear()
            self._pending = []
            self.sources += 1
            self.single = reference if self.sources == 1 else None
        deadline = self.deadline
        for n, line in enumerate(lines, first):
            if (n & 63) == 0 and time.monotonic() > deadline:
                self.stopped = True
                return False
            if self._pending:
                shown = _window(line, 0, CONTEXT_CHARS)
                for hit in self._pending:
                    hit.after.append((n, shown))
                self._pending = [h for h in self._pending if len(h.after) < CONTEXT_LINES]
            found = self._match(line)
            if found is not None:
                self.total += 1
                score, start = found
                key = (score, source, n)
                if len(self._heap) < self.keep or key > self._heap[0][0]:
                    hit = Hit(score, source, n, reference, _window(line, start, MATCH_CHARS), list(self._before))
                    if len(self._heap) < self.keep:
                        heapq.heappush(self._heap, (key, hit))
                    else:
                        heapq.heapreplace(self._heap, (key, hit))
                    self._pending.append(hit)
            self._before.append((n, _window(line, 0, CONTEXT_CHARS)))
        return True

    def best(self) -> list[Hit]:
        return [hit for _, hit in sorted(self._heap, key=lambda item: item[0], reverse=True)]

    def render(self, offset: int, limit: int, max_chars: int) -> str:
        """Matches ``offset``..``offset+limit-1`` (best first) as ``reference · line N: text``
        with ``CONTEXT_LINES`` numbered lines either side, at most ``max_chars`` characters (a
        longer result is cut, its end kept), ending with how to get more and to read around a match."""
        query = self.query
        page = self.best()[offset : offset + limit]
        total = self.total
        what = f"regex {query.text!r}" if query.pattern is not None else f"{query.text!r}"
        scope = self.single if self.single is not None else f"{self.sources} stored items"
        head = f"[context-proxy] Search for {what} in {scope}: {total} matching lines"
        if query.dropped:
            head += f" (only the first {MAX_WORDS} words used)"
        if self.stopped:
            head += " (stopped: the search took too long; narrow it, or pass reference)"
        if not page:
            tail = ("no more matches" if total
                    else "no match; try other words, or read by lines with reference, offset and limit")
            return _cap(f"{head}. {tail}.", max_chars)
        first = page[0]
        around = f'{{"reference": "{first.reference}", "offset": {max(0, first.line - 20)}, "limit": 40}}'

        def ending(end: int, cut: bool) -> tuple[str, str]:
            if end < total and cut:
                more = (f"cut to fit the context window; call again with the same query and offset={end} "
                        f"(next_offset={end})")
            elif end < total:
                more = f"more matches: call again with the same query and offset={end} (next_offset={end})"
            else:
                more = "no more matches"
            return (f", best first; matches {offset}-{end - 1}:",
                    f"[context-proxy] {more}. To read around a match, call with its reference and offset, "
                    f"e.g. {around}.")

        worst = ending(offset + len(page), True)  # the longest ending: reserved before the blocks
        room = max_chars - len(head) - len(worst[0]) - len(worst[1]) - 2
        blocks: list[str] = []
        used = 0
        for hit in page:
            lines = [f"{hit.reference} · line {hit.line}: {hit.text}"]
            lines += [f"    {n}: {text}" for n, text in (*hit.before, *hit.after)]
            block = "\n".join(lines)
            cost = len(block) + (1 if blocks else 0)
            if used + cost > room:
                if blocks:
                    break
                block = block[: max(0, room - 1)] + "…"  # even one match is too long: cut it
                cost = len(block)
            blocks.append(block)
            used += cost
        end = offset + len(blocks)
        mid, tail = ending(end, len(blocks) < len(page))
        return _cap(head + mid + "\n" + "\n".join(blocks) + "\n" + tail, max_chars)


def _cap(text: str, max_chars: int) -> str:
    """``text`` at most ``max_chars`` characters: a longer one keeps its start and its last line."""
    if len(text) <= max_chars:
        return text
    last = text.rsplit("\n", 1)[-1]
    if len(last) + 2 > max_chars:
        return text[: max(0, max_chars - 1)] + "…"
    return text[: max_chars - len(last) - 2] + "…\n" + last


def render(sources: Sequence[Source], query: Query, offset: int, limit: int, max_chars: int,
           deadline: float | None = None) -> str:
    """The search result over ``sources`` (oldest first), as ``Searcher.render``; CPU-bound."""
    searcher = Searcher(query, offset + limit, deadline)
    for s, source in enumerate(sources):
        if not searcher.feed(s, source.reference, source.lines):
            break
    return searcher.render(offset, limit, max_chars)
