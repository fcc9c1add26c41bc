"""tiktoken's encodings, loaded only from its cache directory: never downloads.

``ENCODING_FILES`` pins each supported encoding's download URL and SHA-256 (as
``tiktoken_ext.openai_public`` does); ``cache_file_for`` names the file tiktoken reads it from
(``cache_dir/sha1(URL)``); ``load_cached_encoding`` returns the encoding or why it cannot (a
missing or wrong file: the caller then estimates, ``proxy.tokens.counter``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

_BLOB_BASE = "https://openaipublic.blob.core.windows.net/encodings/"
ENCODING_FILES: dict[str, tuple[str, str]] = {
    "o200k_base": (
        _BLOB_BASE + "o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": (
        _BLOB_BASE + "cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}
"""Download URL and pinned SHA-256 of each supported encoding (as in ``tiktoken_ext.openai_public``)."""



def cache_file_for(encoding_name: str, cache_dir: str) -> str:
    """Path tiktoken reads ``encoding_name`` from: ``cache_dir/sha1(download URL)``.

    Raises ``KeyError`` for an encoding not in ``ENCODING_FILES``.
    """
    url, _ = ENCODING_FILES[encoding_name]
    return os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest())


def default_cache_dir() -> str:
    # The same lookup tiktoken's own loader does (tiktoken/load.py, read_file_cached).
    return (
        os.environ.get("TIKTOKEN_CACHE_DIR")
        or os.environ.get("DATA_GYM_CACHE_DIR")
        or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    )


def load_cached_encoding(encoding_name: str, cache_dir: str) -> tuple[Any, str | None]:
    """Return ``(encoding, None)`` or ``(None, reason)``; never touches the network.

    tiktoken downloads when its cache file is missing *or* fails the SHA-256 check, so both are
    checked here before ``tiktoken.get_encoding`` is called.
    """
    if encoding_name not in ENCODING_FILES:
        return None, f"unknown encoding {encoding_name!r}"
    path = cache_file_for(encoding_name, cache_dir)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}"
    if hashlib.sha256(data).hexdigest() != ENCODING_FILES[encoding_name][1]:
        return None, f"{path} does not match the SHA-256 tiktoken pins for {encoding_name}"
    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = cache_dir
    try:
        import tiktoken

        return tiktoken.get_encoding(encoding_name), None
    except Exception as exc:  # noqa: BLE001 - any loader failure means: use the estimate
        return None, f"tiktoken failed to load {encoding_name}: {exc}"
    finally:
        if previous is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous
