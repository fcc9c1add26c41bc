"""Token counting: cookbook framing, images from real dimensions, media estimates, Anthropic blocks,
tool calls and schemas, reserved output, memo hits, and the no-download fallback."""

from __future__ import annotations

import base64
import io
import logging
import os
import shutil
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.conversation.chat_codec import CHAT
from proxy.tokens.counter import (
    IMAGE_UNKNOWN_SIZE_TOKENS,
    TOKENS_PER_REPLY,
    TokenCounter,
    anthropic_image_tokens,
    load_counter,
    openai_image_tokens,
    reserved_output_tokens,
)
from proxy.tokens.encodings import cache_file_for
from tests.support.shared import NO_ENCODINGS_REASON, needs_exact_encodings
from tests.support.values import nested, nested_text

CACHE_DIR = os.environ.get("TIKTOKEN_CACHE_DIR") or str(Path(__file__).resolve().parents[2] / "shared" / "tiktoken")


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    c = TokenCounter("o200k_base", cache_dir=CACHE_DIR)
    if not c.exact:  # a public clone without ../shared: the expected figures are exact counts
        pytest.skip(NO_ENCODINGS_REASON)
    return c


def png(width: int, height: int, trailing_bytes: int = 0) -> bytes:
    """A minimal valid PNG (one grey pixel row compressed), plus optional junk after IEND."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = zlib.compress(b"\x00" + b"\x80" * width)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"") + b"\x00" * trailing_bytes


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def image_message(url: str, detail: str | None = None) -> dict:
    image_url = {"url": url} if detail is None else {"url": url, "detail": detail}
    return {"role": "user", "content": [{"type": "image_url", "image_url": image_url}]}


# --- formulas ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("width", "height", "detail", "tokens"),
    [
        (1024, 1024, "high", 765),  # OpenAI's worked example: 768x768 -> 4 tiles
        (2048, 4096, "high", 1105),  # OpenAI's worked example: 1024x2048 -> 768x1536 -> 6 tiles
        (4096, 8192, "auto", 1105),
        (512, 512, "high", 255),  # no upscaling: 1 tile
        (100, 30, None, 255),
        (1600, 900, "high", 1105),  # 1365x768 -> 3x2 tiles
        (4096, 4096, "low", 85),
    ],
)
def test_openai_image_formula(width: int, height: int, detail: str | None, tokens: int) -> None:
    assert openai_image_tokens(width, height, detail) == tokens


def test_anthropic_image_formula() -> None:
    assert anthropic_image_tokens(200, 200) == 54  # 40000 / 750, rounded up
    assert anthropic_image_tokens(1092, 1092) == 1590
    assert anthropic_image_tokens(8000, 8000) == 1600  # scaled down, capped


# --- messages ---------------------------------------------------------------------------------


def count_messages(counter: TokenCounter, messages: list[dict], keys: list[str] | None = None) -> int:
    """Tokens of a message list plus the reply priming (what a prompt of ``messages`` costs)."""
    return TOKENS_PER_REPLY + sum(counter.bind(CHAT).count_message(m, keys[i] if keys else None) for i, m in enumerate(messages))


def test_cookbook_framing(counter: TokenCounter) -> None:
    msg = {"role": "user", "content": "hi"}
    assert count_messages(counter, [msg]) == 3 + 1 + 1 + 3  # framing, "user", "hi", reply priming
    named = {"role": "user", "content": "hi", "name": "alice"}
    assert counter.bind(CHAT).count_message(named) == counter.bind(CHAT).count_message(msg) + counter.count_text("alice") + 1
    parts = {"role": "user", "content": [{"type": "text", "text": "hello there"}, {"type": "text", "text": "general"}]}
    assert counter.bind(CHAT).count_message(parts) == 3 + 1 + counter.count_text("hello there") + counter.count_text("general")


def test_png_data_url_counts_its_dimensions_not_its_base64_length(counter: TokenCounter) -> None:
    small_file = counter.bind(CHAT).count_message(image_message(data_url(png(2048, 4096))))
    big_file = counter.bind(CHAT).count_message(image_message(data_url(png(2048, 4096, trailing_bytes=300_000))))
    text_only = counter.bind(CHAT).count_message({"role": "user", "content": []})
    assert small_file == big_file == text_only + 1105
    assert counter.bind(CHAT).count_message(image_message(data_url(png(2048, 4096)), "low")) == text_only + 85
    assert counter.bind(CHAT).count_message(image_message("https://example.com/cat.png")) == text_only + IMAGE_UNKNOWN_SIZE_TOKENS
    assert counter.bind(CHAT).count_message(image_message("data:image/png;base64,!!!notbase64")) == text_only + IMAGE_UNKNOWN_SIZE_TOKENS


def test_jpeg_with_large_exif_block_is_measured(counter: TokenCounter) -> None:
    pil_image = pytest.importorskip("PIL.Image")
    buf = io.BytesIO()
    exif = pil_image.Exif()
    exif[0x010E] = "x" * 20_000  # ImageDescription: pushes the frame header past the first 4 KiB
    pil_image.new("RGB", (1600, 900), (10, 20, 30)).save(buf, "JPEG", exif=exif.tobytes())
    text_only = counter.bind(CHAT).count_message({"role": "user", "content": []})
    assert counter.bind(CHAT).count_message(image_message(data_url(buf.getvalue(), "image/jpeg"))) == text_only + 1105


def test_anthropic_blocks_and_media_estimates(counter: TokenCounter) -> None:
    base = counter.bind(CHAT).count_message({"role": "user", "content": []})
    tool_use = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Oslo"}}]}
    assert counter.bind(CHAT).count_message(tool_use) == 3 + 1 + 3 + counter.count_text("get_weather") + counter.count_text('{"city":"Oslo"}')
    short = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "FACT: oslo_temp=12C"}]}
    long = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "word " * 1000}]}]}
    assert counter.bind(CHAT).count_message(short) == base + 3 + counter.count_text("FACT: oslo_temp=12C")
    assert counter.bind(CHAT).count_message(long) >= base + 1000
    image_block = {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png(200, 200)).decode()}}]}
    assert counter.bind(CHAT).count_message(image_block) == base + 54
    wav = base64.b64encode(b"\x00" * 320_000).decode()  # 10 s at 32 kB/s
    audio = {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}]}
    assert counter.bind(CHAT).count_message(audio) == base + 100
    pdf = {"role": "user", "content": [{"type": "file", "file": {"filename": "a.pdf", "file_data": data_url(b"%PDF" + b"\x00" * 79_996, "application/pdf")}}]}
    assert counter.bind(CHAT).count_message(pdf) == base + 10_000


def test_tool_calls_count_name_and_arguments(counter: TokenCounter) -> None:
    def call(args: str) -> dict:
        return {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "write_file", "arguments": args}}]}

    small, large = counter.bind(CHAT).count_message(call("{}")), counter.bind(CHAT).count_message(call('{"content": "' + "line\\n" * 500 + '"}'))
    # framing + "assistant" + per-call framing + name + arguments (ids are not shown to the model)
    assert small == 3 + 1 + 3 + counter.count_text("write_file") + counter.count_text("{}")
    assert large - small >= 500


def test_a_message_nested_deeper_than_orjson_writes_is_counted_as_its_json(counter: TokenCounter) -> None:
    """Priced as the text orjson would write for it (before: orjson's ``TypeError``, which the
    pipeline answered with a 400 the provider would not give); deep tool schemas too."""
    deep = {"role": "assistant", "content": "x", "state": nested(600)}
    text = '{"role":"assistant","content":"x","state":' + nested_text(600) + "}"
    assert counter.count_json(deep) == counter.count_text(text)
    assert counter.bind(CHAT).count_message(deep) > counter.count_text(nested_text(600)) > 0
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x": nested(600)}}}]
    assert counter.bind(CHAT).count_tools(tools) > counter.count_text(nested_text(600))


def test_a_tool_list_nested_deeper_than_equality_recurses_is_counted_again(counter: TokenCounter) -> None:
    """The same tool list sent again, nested past the levels Python's ``==`` recurses (orjson reads
    1,024): compared with the list remembered, it raised ``RecursionError`` out of the request's
    projection (the proxy's own 500 at the second request; 940 levels in process). Now it is
    counted anew, to the same count."""
    def tools() -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x": nested(1000)}}}]

    first = counter.bind(CHAT).count_tools(tools())
    assert counter.bind(CHAT).count_tools(tools()) == first > counter.count_text(nested_text(1000))


def test_an_equal_tool_list_is_remembered_and_a_changed_one_counted_anew() -> None:
    counter = TokenCounter(cache_dir=CACHE_DIR)
    tool = {"type": "function", "function": {"name": "read_file", "description": "Read a text file.", "parameters": {}}}
    first = counter.bind(CHAT).count_tools([tool])
    hits = counter.memo_hits
    assert counter.bind(CHAT).count_tools(orjson.loads(orjson.dumps([tool]))) == first  # equal, new objects
    assert counter.memo_hits == hits + 1
    longer = [{"type": "function", "function": {**tool["function"], "description": "Read a text file, whole."}}]
    assert counter.bind(CHAT).count_tools(longer) > first  # no stale count for a changed description
    for i in range(20):  # more lists than are remembered: each still counted right
        named = [{"type": "function", "function": {**tool["function"], "name": f"tool_{i:02d}"}}]
        assert counter.bind(CHAT).count_tools(named) == first + counter.count_text(f"tool_{i:02d}") - counter.count_text("read_file")


def test_tool_schemas_and_reserved_output_are_counted(counter: TokenCounter) -> None:
    tool = {"type": "function", "function": {"name": "read_file", "description": "Read a text file.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
    one, two = counter.bind(CHAT).count_tools([tool]), counter.bind(CHAT).count_tools([tool, {**tool, "function": {**tool["function"], "name": "read_other"}}])
    assert counter.bind(CHAT).count_tools(None) == 0 and counter.bind(CHAT).count_tools([]) == 0
    assert one > counter.count_text('{"name":"read_file"}') and two > one + 20
    messages = [{"role": "user", "content": "Read it."}]
    body = {"messages": messages, "tools": [tool], "max_completion_tokens": 300, "max_tokens": 999}
    assert reserved_output_tokens(body) == 300


@pytest.mark.parametrize(
    ("body", "reserved"),
    [({"max_tokens": 512}, 512), ({"max_completion_tokens": 64, "max_tokens": 512}, 64), ({}, 0), ({"max_tokens": None}, 0), ({"max_tokens": True}, 0), ({"max_tokens": "9"}, 0)],
)
def test_reserved_output_tokens(body: dict, reserved: int) -> None:
    assert reserved_output_tokens(body) == reserved


def test_second_count_of_a_long_history_is_memo_hits(counter: TokenCounter) -> None:
    fresh = TokenCounter("o200k_base", memo_size=20_000, cache_dir=CACHE_DIR)
    history = [{"role": "user" if i % 2 else "assistant", "content": f"message {i} " + "lorem ipsum dolor sit amet " * 20} for i in range(5000)]
    t0 = time.perf_counter()
    first = count_messages(fresh, history)
    t1 = time.perf_counter()
    second = count_messages(fresh, history)
    t2 = time.perf_counter()
    assert first == second
    assert (fresh.memo_misses, fresh.memo_hits) == (5000, 5000)
    assert (t2 - t1) < (t1 - t0) / 3
    keyed = count_messages(fresh, history[:10], keys=[f"k{i}" for i in range(10)])
    assert keyed == count_messages(fresh, history[:10], keys=[f"k{i}" for i in range(10)])
    assert fresh.memo_hits == 5000 + 10


def test_memo_is_bounded() -> None:
    small = TokenCounter("o200k_base", memo_size=3, cache_dir=CACHE_DIR)
    for i in range(10):
        small.bind(CHAT).count_message({"role": "user", "content": str(i)})
    small.bind(CHAT).count_message({"role": "user", "content": "0"})
    assert small.memo_hits == 0 and small.memo_misses == 11


# --- encodings and fallback -------------------------------------------------------------------


@needs_exact_encodings
def test_cl100k_base_loads_exactly_from_the_cache() -> None:
    legacy = TokenCounter("cl100k_base", cache_dir=CACHE_DIR)
    assert legacy.exact and legacy.encoding_name == "cl100k_base"


def test_missing_cache_file_falls_back_fast_without_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", CACHE_DIR)  # restored after the test
    import tiktoken.load

    def no_network(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("tiktoken tried to download")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    caplog.set_level(logging.WARNING, logger="context_proxy.tokens")
    t0 = time.perf_counter()
    c = load_counter(str(tmp_path), "o200k_base")
    assert time.perf_counter() - t0 < 1.0
    assert not c.exact and c.fallback_reason
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(tmp_path)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert c.count_text("abcd" * 10) == 10
    assert c.count_text("abcde") == 2
    assert c.count_text("éé") == 1  # 4 UTF-8 bytes
    assert c.count_text("日本語の文章") == 5  # 18 bytes
    assert count_messages(c, [{"role": "user", "content": "abcdefgh"}]) == 3 + 1 + 2 + 3


def test_corrupt_cache_file_falls_back_and_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", CACHE_DIR)
    path = Path(cache_file_for("cl100k_base", str(tmp_path)))
    path.write_bytes(b"not a bpe file")
    c = load_counter(str(tmp_path), "cl100k_base")
    assert not c.exact and "SHA-256" in (c.fallback_reason or "")
    assert path.read_bytes() == b"not a bpe file"  # tiktoken would have deleted it and re-downloaded


@needs_exact_encodings
def test_copied_cache_dir_loads_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", CACHE_DIR)
    src = cache_file_for("o200k_base", CACHE_DIR)
    shutil.copy(src, cache_file_for("o200k_base", str(tmp_path)))
    c = load_counter(str(tmp_path))
    assert c.exact and c.count_text("hello world") == 2


@pytest.mark.parametrize("role", ["ipython", "wizard", "x" * 50])
def test_a_role_the_proxy_does_not_know_is_counted_as_text(counter: TokenCounter, role: str) -> None:
    """Issue 15: an unknown-role message costs what a known one with the same fields does, its
    role's text instead of the known role's; unknown fields of it count as their text/JSON."""
    content = [{"type": "text", "text": "The answer is 42.", "x_part": "p"}]
    known = {"role": "user", "content": content, "x_vendor": {"k": "v"}}
    odd = {"role": role, "content": content, "x_vendor": {"k": "v"}}
    assert counter.bind(CHAT).count_message(odd) - counter.bind(CHAT).count_message(known) == counter.count_text(role) - counter.count_text("user")
    plain = {"role": role, "content": "The answer is 42."}
    assert counter.bind(CHAT).count_message(odd) == counter.bind(CHAT).count_message(plain) + counter.count_text('{"k":"v"}')
    assert counter.bind(CHAT).count_message({"role": ["odd"], "content": "x"}) == 3 + counter.count_text('["odd"]') + counter.count_text("x")
