"""An earlier commit's proxy as a candidate beside this tree's, in the same run (issue 18, item 7).

    python -m tests.benchmarks --compare 9cd5e7a --out DIR       # a revision of this repository
    python -m tests.benchmarks --baseline-tree PATH --out DIR    # a checked-out tree (copied, never changed)

``Baseline.from_rev`` unpacks ``git archive REV`` into a temporary directory (nothing in the
repository changes); ``Baseline.from_tree`` copies a tree there (without ``.git`` and ``.venv``).
Both then lay this tree's ``tests/benchmarks`` over the copy's own, so each side is measured by
the same harness code and only ``proxy/`` and ``storage/`` differ.

- The overhead section serves the baseline as the current proxy is served: the tree's own
  ``python -m proxy.cli serve`` with the same flags and environment (``candidates.Server``), one
  more candidate (``baseline``) interleaved with the others in every repetition.
- The in-process sections (``pipeline``: CPU per MB of history; ``storage``: bytes per unique
  message byte) run for the baseline in a child process (``python -m tests.benchmarks.baseline``)
  whose working directory and ``PYTHONPATH`` are the copy, so ``import proxy`` is the baseline's
  (the child checks ``proxy.__file__`` and reports it). They run right after the current tree's
  same section, in the same run.

Both sides use this environment's Python and packages (the dependencies did not change between
the commits compared; a tree that needs others will fail to start, and says so in its log).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import orjson

from tests.benchmarks import REPO_DIR, SHARED_DIR, SHARED_ENV
from tests.benchmarks.config import BenchConfig

IN_PROCESS_SECTIONS = ("pipeline", "storage")
"""The sections the child process runs for the baseline (overhead serves it as a server)."""
CHILD_TIMEOUT_S = 3600.0


@dataclasses.dataclass
class Baseline:
    """A tree to measure beside the current one: ``label`` names it in the report (the short
    revision, or the directory's name), ``tree`` is the prepared copy (temporary; ``cleanup()``
    removes it), ``source`` what it was made from (``REV`` or the path)."""

    label: str
    tree: Path
    source: str
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    def from_rev(cls, rev: str, repo: Path = REPO_DIR) -> Baseline:
        """``git archive REV`` of ``repo`` unpacked into a temporary directory; ``ValueError``
        when ``rev`` is not a commit of ``repo`` (or ``repo`` is no git repository)."""
        probe = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--short", f"{rev}^{{commit}}"],
                               capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            raise ValueError(f"{rev!r} is not a commit of {repo}: {probe.stderr.strip()}")
        short = probe.stdout.strip()
        tmp = tempfile.TemporaryDirectory(prefix=f"bench-baseline-{short}-")
        tree = Path(tmp.name) / "tree"
        tree.mkdir()
        archive = Path(tmp.name) / "tree.tar"
        with archive.open("wb") as out:
            subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", short], stdout=out, check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        archive.unlink()
        baseline = cls(label=short, tree=tree, source=rev, _tmp=tmp)
        baseline.lay_harness()
        return baseline

    @classmethod
    def from_tree(cls, path: Path) -> Baseline:
        """A copy of the tree at ``path`` (which must hold ``proxy/``) in a temporary directory."""
        path = path.resolve()
        if not (path / "proxy").is_dir():
            raise ValueError(f"{path} has no proxy/ package")
        tmp = tempfile.TemporaryDirectory(prefix="bench-baseline-tree-")
        tree = Path(tmp.name) / "tree"
        shutil.copytree(path, tree, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.db*"))
        baseline = cls(label=path.name, tree=tree, source=str(path), _tmp=tmp)
        baseline.lay_harness()
        return baseline

    def lay_harness(self) -> None:
        """Replace the copy's ``tests/benchmarks`` with this tree's (same harness on both sides)."""
        target = self.tree / "tests" / "benchmarks"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(REPO_DIR / "tests" / "benchmarks", target, ignore=shutil.ignore_patterns("__pycache__"))
        init = self.tree / "tests" / "__init__.py"
        if not init.exists():
            init.write_text("")

    def env(self) -> dict[str, str]:
        """The environment of a process running the baseline: its tree first on ``sys.path``, the
        shared traces and tiktoken files where this run finds them."""
        env = os.environ.copy()
        env["PYTHONPATH"] = str(self.tree)
        env[SHARED_ENV] = str(SHARED_DIR)
        env.pop("PYTHONSAFEPATH", None)  # the working directory (the tree) must stay on sys.path
        return env

    def run_sections(self, cfg: BenchConfig, sections: tuple[str, ...]) -> dict[str, Any]:
        """The in-process ``sections`` (of ``IN_PROCESS_SECTIONS``) measured on the baseline in a
        child process: ``{section: result, "proxy_file": the baseline's proxy/__init__.py}``.
        ``RuntimeError`` with the child's output when it fails."""
        wanted = tuple(s for s in IN_PROCESS_SECTIONS if s in sections)
        out = self.tree.parent / "sections.json"
        cmd = [sys.executable, "-m", "tests.benchmarks.baseline", "--config", orjson.dumps(config_json(cfg), option=orjson.OPT_NON_STR_KEYS).decode(),
               "--sections", ",".join(wanted), "--json", str(out)]
        proc = subprocess.run(cmd, cwd=self.tree, env=self.env(), capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S, check=False)
        sys.stdout.write("".join(f"  [{self.label}] {line}\n" for line in proc.stdout.splitlines()))
        if proc.returncode != 0:
            raise RuntimeError(f"baseline {self.label} sections failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        result: dict[str, Any] = orjson.loads(out.read_bytes())
        return result

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def config_json(cfg: BenchConfig) -> dict[str, Any]:
    """``cfg`` as JSON-ready data (``out`` a string; dump with ``OPT_NON_STR_KEYS``: ``config_from_json`` makes the
    keys of ``requests`` ints again)."""
    data = dataclasses.asdict(cfg)
    data["out"] = str(cfg.out)
    return data


def config_from_json(data: dict[str, Any]) -> BenchConfig:
    fields = {f.name: f for f in dataclasses.fields(BenchConfig)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            continue  # a field this harness does not know
        if key == "out":
            value = Path(value)
        elif key == "requests":
            value = {int(k): v for k, v in value.items()}
        elif isinstance(value, list):
            value = tuple(value)
        values[key] = value
    return BenchConfig(**values)


def main(argv: list[str] | None = None) -> int:
    """The child: run the in-process sections on the ``proxy`` that ``sys.path`` finds first
    (the baseline tree: the working directory) and write ``{section: result, "proxy_file"}``."""
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.baseline")
    parser.add_argument("--config", required=True, help="BenchConfig as JSON.")
    parser.add_argument("--sections", required=True)
    parser.add_argument("--json", required=True, type=Path)
    args = parser.parse_args(argv)
    import proxy

    proxy_file = str(Path(proxy.__file__ or "").resolve())
    if not proxy_file.startswith(str(Path.cwd().resolve())):
        raise SystemExit(f"proxy comes from {proxy_file}, not from the baseline tree {Path.cwd()}")
    cfg = config_from_json(orjson.loads(args.config))
    from tests.benchmarks import pipeline, storage_growth

    modules = {"pipeline": pipeline, "storage": storage_growth}
    results: dict[str, Any] = {"proxy_file": proxy_file}
    for name in (s for s in args.sections.split(",") if s):
        print(f"[{name}]", flush=True)
        results[name] = modules[name].run(cfg)
    args.json.write_bytes(orjson.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
