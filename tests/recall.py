"""Recall through the read tool (issue 17, item 6): facts planted where only stored content keeps
them, asked for later, through the proxy against the strict fake provider.

``python -m tests.recall --out docs/recall.md`` runs every configuration at full scale (at least 20
facts each, streamed and not) and writes the report; ``tests/e2e/test_recall.py`` runs the same
code at a smaller scale and asserts the goal. The fake model (``tests/fakes/read_tool.py``)
searches for ``FACT <key>`` when the read tool offers ``query`` and pages otherwise
(``--pages``: the model only pages, for comparison).

Configurations (``kind``):

- ``huge``: each session has two huge tool outputs (40k-200k characters) with one fact in the
  middle of the older one and distractor lines naming the key in both, then the question;
- ``summary``: 60 turns of about 700 tokens at 32k; facts in early user turns; the fake summarizer
  drops every ``FACT:`` line, so only the archive keeps them; then one question per fact;
- ``offload``: at 128k, four offloaded outputs (~100k characters each) per session, one fact
  alone in the middle of each; then one question per fact;
- ``huge-trace``: as ``huge`` with real observations from ``/work/shared/traces`` as the text
  around the fact (skipped, saying so, when that directory is absent).

Per question: recalled or not, read rounds used (model requests - 1) and the tokens the rounds
added (prompt tokens of the last model request minus the first, as the fake provider counted).
Over all model requests: over the window (the provider answered an overflow, or counted more
than its window) and invalid (the strict fake refused the request).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from proxy.app import create_app
from proxy.settings import Settings
from tests.fakes.server import UvicornServer
from tests.fakes.state import FakeState
from tests.fakes.upstream import create_fake_upstream
from tests.support.shared import TRACES_DIR, tiktoken_cache_dir

TRACES = TRACES_DIR
READ = "context_proxy_read"
TOOLS = [{"type": "function", "function": {"name": "run", "description": "Run a command.",
                                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]


@dataclass(frozen=True)
class Config:
    kind: str
    window: int
    stream: bool
    facts: int
    """Facts (questions) in all."""

    @property
    def name(self) -> str:
        return f"{self.kind} @{self.window // 1024}k {'stream' if self.stream else 'json'}"


@dataclass
class Outcome:
    recalled: bool
    rounds: int
    tokens_added: int
    in_prompt: bool
    """The fact was in the first request the model saw for the question (then it needs no read)."""


@dataclass
class Result:
    config: Config
    outcomes: list[Outcome] = field(default_factory=list)
    model_requests: int = 0
    over_window: int = 0
    invalid: int = 0
    tool_seen: int = 0
    seconds: float = 0.0
    skipped: str | None = None

    @property
    def recalled(self) -> int:
        return sum(o.recalled for o in self.outcomes)


@contextmanager
def servers(window: int, pages: bool, db_dir: Path) -> Iterator[tuple[Any, FakeState]]:
    """The fake provider and the proxy (a fresh SQLite database), each under uvicorn."""
    app, state = create_fake_upstream()
    state.read_tool_search = not pages
    model = f"fake-{window // 1024}k"
    with UvicornServer(app) as up:
        models = db_dir / "models.yaml"
        models.write_text(f'"{model}":\n  context_window_tokens: {window}\n')
        settings = Settings(upstream_url=up.url + "/v1", database_url=f"sqlite:///{db_dir / 'recall.db'}",
                            models_file=str(models), tiktoken_cache_dir=tiktoken_cache_dir())
        with UvicornServer(create_app(settings)) as proxy:
            yield proxy, state


class Session:
    """One client conversation through the proxy (the official SDK)."""

    def __init__(self, proxy: Any, state: FakeState, cfg: Config, session_id: str, result: Result) -> None:
        self.client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-recall-0123456789", max_retries=0,
                                    default_headers={"x-session-id": session_id}, timeout=120)
        self.state, self.cfg, self.result = state, cfg, result
        self.model = f"fake-{cfg.window // 1024}k"
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful engineering agent."}]

    def send(self) -> str:
        """Send the history; append and return the answer's text."""
        before = len(self.state.requests)
        if self.cfg.stream:
            chunks = list(self.client.chat.completions.create(model=self.model, messages=self.messages, tools=TOOLS, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            seen = any(d.function and d.function.name == READ for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or [])
        else:
            reply = self.client.chat.completions.create(model=self.model, messages=self.messages, tools=TOOLS)
            text = reply.choices[0].message.content or ""
            seen = any(c.function.name == READ for c in reply.choices[0].message.tool_calls or [])
        self.result.tool_seen += seen
        self.last = [r for r in self.state.requests[before:] if r.path.endswith("/chat/completions") and not r.is_summary]
        for r in self.last:
            self.result.model_requests += 1
            self.result.invalid += r.outcome == "invalid"
            self.result.over_window += r.outcome in ("overflow", "truncated") or (r.prompt_tokens or 0) > self.cfg.window
        self.messages.append({"role": "assistant", "content": text})
        return text

    def tool_output(self, content: str) -> None:
        n = len(self.messages)
        self.messages += [{"role": "user", "content": f"Run step {n}."},
                          {"role": "assistant", "content": None, "tool_calls": [
                              {"id": f"call_{n}", "type": "function", "function": {"name": "run", "arguments": json.dumps({"cmd": f"step {n}"})}}]},
                          {"role": "tool", "tool_call_id": f"call_{n}", "content": content}]

    def ask(self, key: str, value: str) -> None:
        """Ask for one fact on a branch of its own (the question and answer are not kept), so
        that no question is answered from an earlier question's read."""
        history = list(self.messages)
        self.messages.append({"role": "user", "content": f"QUESTION: {key}"})
        answer = self.send()
        self.messages = history
        ok = [r for r in self.last if r.outcome == "ok"]
        added = (ok[-1].prompt_tokens or 0) - (ok[0].prompt_tokens or 0) if len(ok) > 1 else 0
        seen = f"FACT: {key}={value}".encode() in self.last[0].body if self.last else False
        self.result.outcomes.append(Outcome(answer == f"ANSWER: {value}", max(0, len(self.last) - 1), max(0, added), seen))


def log_lines(rng: random.Random, chars: int) -> list[str]:
    lines, size = [], 0
    while size < chars:
        i = len(lines)
        line = f"{i:06d} {rng.choice(['INFO', 'DEBUG', 'WARN'])} svc-{rng.randrange(40)} handled request {rng.getrandbits(32):08x} in {rng.randrange(900)} ms"
        lines.append(line)
        size += len(line) + 1
    return lines


_TRACE_LINES: list[str] | None = None


def trace_lines(rng: random.Random, chars: int) -> list[str]:
    """Lines of real tool observations from the shared traces, from a random start, wrapping."""
    global _TRACE_LINES
    if _TRACE_LINES is None:
        _TRACE_LINES = []
        for path in sorted(TRACES.glob("*.jsonl")):
            for raw in path.read_text().splitlines():
                m = json.loads(raw)
                if m.get("role") == "tool" and isinstance(m.get("content"), str):
                    _TRACE_LINES += [line for line in m["content"].splitlines() if "FACT" not in line]
    out, size, i = [], 0, rng.randrange(len(_TRACE_LINES))
    while size < chars:
        line = _TRACE_LINES[i % len(_TRACE_LINES)]
        out.append(line)
        size += len(line) + 1
        i += 1
    return out


def planted(lines: list[str], fact: str | None, key: str, rng: random.Random) -> str:
    lines = list(lines)
    for _ in range(3):  # distractors: the key without its fact, anywhere
        lines.insert(rng.randrange(len(lines)), f"WARN lookup of {key} deferred (cache miss)")
    if fact is not None:
        lines.insert(len(lines) // 2 + rng.randrange(-50, 50), fact)
    return "\n".join(lines)


def run_huge(proxy: Any, state: FakeState, cfg: Config, result: Result, rng: random.Random, trace: bool) -> None:
    make = trace_lines if trace else log_lines
    for s in range(cfg.facts):
        key, value = f"h{s}_{rng.getrandbits(24):06x}", f"V-{rng.getrandbits(32):08x}"
        session = Session(proxy, state, cfg, f"huge-{s}", result)
        session.messages.append({"role": "user", "content": "Find out why the nightly build failed."})
        session.tool_output(planted(make(rng, rng.randrange(40_000, 200_000)), f"FACT: {key}={value}", key, rng))
        session.tool_output(planted(make(rng, rng.randrange(40_000, 200_000)), None, key, rng))
        session.ask(key, value)


def run_summary(proxy: Any, state: FakeState, cfg: Config, result: Result, rng: random.Random) -> None:
    state.summary_drop_substring = "FACT:"  # the summary misses every fact: only the archive keeps them
    per_session = 10
    for s in range((cfg.facts + per_session - 1) // per_session):
        session = Session(proxy, state, cfg, f"summary-{s}", result)
        facts = [(f"s{s}_{i}_{rng.getrandbits(20):05x}", f"V-{rng.getrandbits(32):08x}") for i in range(min(per_session, cfg.facts - s * per_session))]
        at = dict(zip(sorted(rng.sample(range(2, 40), len(facts))), facts, strict=True))
        for turn in range(60):
            words = " ".join(rng.choice(["the", "build", "queue", "worker", "retried", "cache", "index", "shard", "latency", "report"]) for _ in range(480))
            note = f"Note for later. FACT: {at[turn][0]}={at[turn][1]}\n" if turn in at else ""
            session.messages.append({"role": "user", "content": f"Step {turn}. {note}{words}"})
            session.send()
        for key, value in facts:
            session.ask(key, value)


def run_offload(proxy: Any, state: FakeState, cfg: Config, result: Result, rng: random.Random) -> None:
    per_session = 4
    for s in range((cfg.facts + per_session - 1) // per_session):
        session = Session(proxy, state, cfg, f"offload-{s}", result)
        session.messages.append({"role": "user", "content": "Collect the logs of every service."})
        facts = [(f"o{s}_{i}_{rng.getrandbits(20):05x}", f"V-{rng.getrandbits(32):08x}") for i in range(min(per_session, cfg.facts - s * per_session))]
        for key, value in facts:
            session.tool_output(planted(log_lines(rng, 100_000), f"FACT: {key}={value}", key, rng))
        for key, value in facts:
            session.ask(key, value)


def run(cfg: Config, *, seed: int = 17, pages: bool = False) -> Result:
    result = Result(cfg)
    if cfg.kind == "huge-trace" and not TRACES.is_dir():
        result.skipped = f"{TRACES} is absent (the shared traces live there)"
        return result
    rng = random.Random(f"{seed}:{cfg.name}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, servers(cfg.window, pages, Path(tmp)) as (proxy, state):
        if cfg.kind in ("huge", "huge-trace"):
            run_huge(proxy, state, cfg, result, rng, trace=cfg.kind == "huge-trace")
        elif cfg.kind == "summary":
            run_summary(proxy, state, cfg, result, rng)
        else:
            run_offload(proxy, state, cfg, result, rng)
    result.seconds = time.perf_counter() - started
    return result


def configs(facts: int) -> list[Config]:
    shapes = [("huge", 16384), ("huge", 32768), ("summary", 32768), ("offload", 131072), ("huge-trace", 32768)]
    return [Config(kind, window, stream, facts) for kind, window in shapes for stream in (False, True)]


def row(r: Result) -> str:
    if r.skipped:
        return f"| {r.config.name} | skipped: {r.skipped} | | | | | | |"
    n = len(r.outcomes)
    added = [o.tokens_added for o in r.outcomes if o.rounds]
    rounds = [o.rounds for o in r.outcomes]
    med = int(statistics.median(added)) if added else 0
    return (f"| {r.config.name} | {r.recalled}/{n} ({100 * r.recalled / max(n, 1):.0f}%) | {sum(o.in_prompt for o in r.outcomes)} | "
            f"{med} / {max(added, default=0)} | "
            f"{statistics.mean(rounds):.2f} / {max(rounds, default=0)} | {r.over_window} / {r.model_requests} | {r.invalid} | "
            f"{r.tool_seen} | {r.seconds:.0f} s |")


HEADER = ("| configuration | recalled | facts already in the first prompt | tokens added by read rounds per question (median / max) | read rounds (mean / max) | "
          "requests over the window / model requests | invalid requests | proxy tool seen by client | time |\n"
          "|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="Markdown report to write (default: print)")
    parser.add_argument("--facts", type=int, default=20, help="facts per configuration")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--pages", action="store_true", help="also run with a model that only pages (no search)")
    args = parser.parse_args()
    results = [run(cfg, seed=args.seed) for cfg in configs(args.facts)]
    paged = [run(cfg, seed=args.seed, pages=True) for cfg in configs(args.facts) if not cfg.stream] if args.pages else []
    total = sum(len(r.outcomes) for r in results)
    recalled = sum(r.recalled for r in results)
    lines = [
        "# Recall through the read tool (issue 17)",
        "",
        (f"Generated by `python -m tests.recall --out docs/recall.md --facts {args.facts} --seed {args.seed}"
         f"{' --pages' if args.pages else ''}` (see `tests/recall.py` for the configurations). "
         "The proxy runs its defaults (read budget 25% of the window, at most 8 rounds, session scope) against the "
         "strict fake provider; its model searches for `FACT <key>` when the read tool offers `query`, else pages."),
        "",
        f"**{recalled}/{total} facts recalled ({100 * recalled / max(total, 1):.1f}%).**",
        "",
        ("Each question is asked on a branch of its own (its question and answer are not kept), so no fact is "
         "answered from an earlier question's read; the third column counts facts that the first request the model "
         "saw for its question held anyway (none should: each needs a read). Tokens added: prompt tokens of the question's last model request minus its first, "
         "as the fake provider counted them (the budget is 25% of the window: 4,096 tokens at 16k, 8,192 at 32k, "
         "32,768 at 128k). Over the window: the provider answered an overflow or counted more than its window. "
         "Invalid: the strict fake refused the request."),
        "",
        HEADER,
        *[row(r) for r in results],
    ]
    if paged:
        lines += ["", "The same (not streamed) with a model that only pages (`offset`/`limit`, as before issue 17):", "",
                  HEADER, *[row(r) for r in paged]]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
