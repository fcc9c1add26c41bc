"""Put tiktoken's encoding files into a cache directory at image build time (never at run time).

    python fetch_tiktoken.py DIR

Files are named as tiktoken's cache names them (SHA-1 of the download URL) and checked against
the SHA-256 that tiktoken pins (``proxy.tokens.encodings.ENCODING_FILES``). With ``TIKTOKEN_SEED_DIR`` set,
they are copied from that directory (an offline build, or the tests); otherwise downloaded.
Finally the proxy's own loader must load them exactly (not the byte estimate), else exit 1.
"""

from __future__ import annotations

import hashlib
import os
import sys
import urllib.request
from pathlib import Path

from proxy.tokens.counter import load_counter
from proxy.tokens.encodings import ENCODING_FILES, cache_file_for


def fetch(target: Path, seed: Path | None) -> None:
    """Fill ``target`` with every encoding of ``ENCODING_FILES``; raises ``SystemExit`` on a bad file."""
    target.mkdir(parents=True, exist_ok=True)
    for name, (url, sha256) in ENCODING_FILES.items():
        dest = Path(cache_file_for(name, str(target)))
        if seed is not None:
            data = (seed / dest.name).read_bytes()
        else:
            with urllib.request.urlopen(url, timeout=120) as resp:  # noqa: S310 - fixed https URL
                data = resp.read()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise SystemExit(f"{name}: SHA-256 mismatch (expected {sha256})")
        tmp = dest.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        dest.chmod(0o644)
        print(f"{name}: {dest} ({len(data):,} bytes)")
    for name in ENCODING_FILES:
        if not load_counter(str(target), name).exact:
            raise SystemExit(f"{name}: the proxy cannot load the file it was given")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: fetch_tiktoken.py DIR")
    seed_dir = os.environ.get("TIKTOKEN_SEED_DIR")
    fetch(Path(sys.argv[1]), Path(seed_dir) if seed_dir else None)
