"""Instructions per request, the proxy against the floor (issue 21, items 2 and 3): load-independent.

CPU time per request moves with whatever else runs on the core (other people's tests, the crowd);
instruction counts do not. Each server runs under ``valgrind --tool=callgrind`` with instrumentation
off (``--instr-atstart=no``) through its start and a warm-up of ``WARMUP`` requests, then on for
``cfg.instruction_requests`` requests at concurrency 16 (the overhead section's request; then the
same streamed: its SSE reply observed and logged, the path Claude Code and Codex take), dumped
(``callgrind_control``) and read: instructions (``Ir``) per request in all and by
shared object (``libpython``: the interpreter running Python code; ``libsqlite3``: the log's SQL;
``libcrypto``: hashing; ...). The proxy is ``python -m proxy.cli serve`` as the overhead section
serves it, the floor the same raw relay. Needs ``valgrind`` (``apt-get install valgrind``); the
section is skipped, with the reason, without it. About a minute per server and mode.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.benchmarks.candidates import Server, cores, free_port, serve_command
from tests.benchmarks.config import BenchConfig
from tests.benchmarks.overhead import LoadGenerator, request_body

WARMUP = 200
CONCURRENCY = 16
VALGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]


def _ready(proc: subprocess.Popen[bytes], url: str, timeout_s: float = 240.0) -> None:
    """Wait until ``url`` answers (any status: ``{}`` is no chat request)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s  # the interpreter under valgrind starts slowly
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(url, data=b"{}"), timeout=10).read()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer under valgrind") from None
            time.sleep(0.2)


def by_object(path: Path) -> dict[str, int]:
    """Instructions of a callgrind output file by shared object (``ob=``), self cost."""
    totals: collections.Counter[str] = collections.Counter()
    names: dict[str, str] = {}
    current = "?"
    cost_line = re.compile(r"^(?:[+-]?\d+|\*) (\d+)$")  # position (``line`` compressed), Ir
    in_call = False
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("ob=", "cob=")):  # a name is given once, where first seen, either way
            ref, _, name = line.partition("=")[2].partition(" ")
            if name:
                names[ref] = name
            if line.startswith("ob="):
                current = ref
        elif line.startswith("calls="):
            in_call = True  # the next cost line is the call's inclusive cost: not this object's own
        elif line and (line[0].isdigit() or line[0] in "+-*"):
            m = cost_line.match(line)
            if m and not in_call:
                totals[current] += int(m.group(1))
            in_call = False
    return {Path(names.get(k, k)).name: v for k, v in totals.items()}


def measure(kind: str, cfg: BenchConfig, workdir: Path, stream: bool = False) -> dict[str, Any]:
    """``kind`` (``proxy`` or ``floor``) under callgrind, its requests streamed or not:
    ``{"requests", "errors", "ir_per_request", "by_object"}``."""
    near, far = cores()
    upstream = Server("upstream", near, workdir, ready_path="/v1/chat/completions")
    out = workdir / f"callgrind.{kind}"
    pin = (lambda: os.sched_setaffinity(0, {far})) if far is not None else None
    env = dict(os.environ, CONTEXT_PROXY_TIKTOKEN_CACHE_DIR=os.environ.get("TIKTOKEN_CACHE_DIR", ""))
    if kind == "proxy":
        port = free_port()
        cmd = serve_command(sys.executable, port, upstream.url + "/v1", workdir / "proxy.db")
    else:
        port = 0
        cmd = [sys.executable, "-m", "tests.benchmarks.servers", "floor", "--upstream", upstream.url + "/v1",
               "--workdir", str(workdir)]
    log = open(workdir / f"{kind}.valgrind.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([*VALGRIND, f"--callgrind-out-file={out}", *cmd], stdout=subprocess.PIPE if not port else log,
                            stderr=log, env=env, preexec_fn=pin)
    gen = LoadGenerator(near)
    try:
        if not port:
            assert proc.stdout is not None
            port = int(proc.stdout.readline().decode().split()[1])
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        _ready(proc, url)
        body = request_body(stream)
        gen.run(url, body, CONCURRENCY, WARMUP, False)
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
        res = gen.run(url, body, CONCURRENCY, cfg.instruction_requests, False)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
    finally:
        gen.stop()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        upstream.stop()
    dumps = sorted(workdir.glob(f"callgrind.{kind}.*"))  # the dump taken by callgrind_control, not the exit's
    objects = by_object(dumps[-1])
    n = cfg.instruction_requests
    return {"requests": n, "errors": res["errors"], "ir_per_request": sum(objects.values()) / n,
            "by_object": {k: v / n for k, v in sorted(objects.items(), key=lambda kv: -kv[1])}}


def status() -> str | None:
    """``None`` when callgrind can run, else why not."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        return "not measured (valgrind is not installed: apt-get install valgrind)"
    return None


def run(cfg: BenchConfig) -> dict[str, Any]:
    """``{"status", "concurrency", "proxy", "floor", "proxy_vs_floor", "streamed"}``, ``streamed`` the
    same three for streamed requests (see the module docstring)."""
    why = status()
    if why is not None:
        print(f"  instructions: {why}", flush=True)
        return {"status": why}
    out: dict[str, Any] = {"status": None, "concurrency": CONCURRENCY, "streamed": {}}
    for stream in (False, True):
        into = out["streamed"] if stream else out
        for kind in ("floor", "proxy"):
            with tempfile.TemporaryDirectory(prefix=f"bench-instructions-{kind}-") as tmp:
                into[kind] = measure(kind, cfg, Path(tmp), stream)
            print(f"  instructions {kind}{' streamed' if stream else ''}: {into[kind]['ir_per_request']:,.0f} a request",
                  flush=True)
        into["proxy_vs_floor"] = into["proxy"]["ir_per_request"] / into["floor"]["ir_per_request"]
    return out


def table(r: dict[str, Any]) -> list[str]:
    """The report's section."""
    lines = ["## Instructions per request (callgrind)", ""]
    if r.get("status"):
        return [*lines, r["status"], ""]
    proxy, floor = r["proxy"], r["floor"]
    lines += [f"Concurrency {r['concurrency']}, non-streaming, {proxy['requests']} requests after a warm-up, instructions "
              f"(Ir) of the server process: the proxy {proxy['ir_per_request']:,.0f}, the floor "
              f"{floor['ir_per_request']:,.0f} ({r['proxy_vs_floor']:.2f}×). By shared object (self cost):", "",
              "| object | proxy Ir/request | floor Ir/request |", "|---|---|---|"]
    for name in list(proxy["by_object"])[:10]:
        lines.append(f"| {name} | {proxy['by_object'][name]:,.0f} | {floor['by_object'].get(name, 0):,.0f} |")
    streamed = r.get("streamed") or {}
    if streamed:
        lines += ["", f"The same request streamed (the reply's SSE events observed and logged): the proxy "
                  f"{streamed['proxy']['ir_per_request']:,.0f}, the floor {streamed['floor']['ir_per_request']:,.0f} "
                  f"({streamed['proxy_vs_floor']:.2f}×)."]
    return [*lines, ""]
