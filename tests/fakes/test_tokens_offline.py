"""Without tiktoken's encoding file the fake provider counts with its fallback and never tries to
download it (a public clone on a machine without network used to hang here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_DIR

SCRIPT = """
import tiktoken.load

def no_network(*args, **kwargs):
    raise SystemExit("tiktoken tried to download " + repr(args[:1]))

tiktoken.load.read_file = no_network
from tests.fakes.tokens import count_prompt_tokens, count_text_tokens, encoding
from tests.fakes.completions import truncate_front
assert encoding() is None
assert count_text_tokens("abcde") == 2 and count_text_tokens("日本語") == 3  # ceil(utf8 bytes / 4)
body = {"messages": [{"role": "user", "content": "abcdefgh"}]}
assert count_prompt_tokens(body) == 3 + 3 + 2
cut = truncate_front({"messages": [{"role": "user", "content": "x" * 400}]}, 20)
assert len(cut.encode()) <= 20 * 4
print("ok")
"""


def test_the_fake_counts_offline_without_the_encoding_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"} | {
        "TIKTOKEN_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO_DIR)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
