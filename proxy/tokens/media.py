"""Token costs of images and other media in chat messages, from their real size (never from the
length of their base64 text).

Images follow OpenAI's documented vision pricing (tiles of 512 px after fitting the image in
2048x2048 and its short side in 768 px) and Anthropic's (width x height / 750, capped); sizes are
read with ``imagesize`` from a decoded prefix of the ``data:`` URL. Audio and files use documented
estimates.
"""

from __future__ import annotations

import base64
import binascii
import io
import math

import imagesize

IMAGE_LOW_DETAIL_TOKENS = 85
"""OpenAI vision pricing: an image at ``detail: low`` costs 85 tokens whatever its size."""
IMAGE_TILE_TOKENS = 170
"""OpenAI vision pricing (GPT-4o/4.1 tile models): 170 tokens per 512 px tile at high detail ..."""
IMAGE_BASE_TOKENS = 85
"""... plus 85 base tokens."""
IMAGE_UNKNOWN_SIZE_TOKENS = 765
"""Remote image URLs (dimensions unknown without fetching): priced as a 1024x1024 image at high
detail (4 tiles: 4 * 170 + 85 = 765), OpenAI's own worked example."""
ANTHROPIC_IMAGE_MAX_TOKENS = 1600
"""Anthropic: tokens = width * height / 750; larger images are scaled down to about 1.15
megapixels (long edge at most 1568 px), so one image costs at most about 1,600 tokens."""
AUDIO_TOKENS_PER_SECOND = 10
"""Estimate (approximate): audio input costs about 10 tokens per second on GPT-4o audio models."""
AUDIO_BYTES_PER_SECOND = {"wav": 32_000, "pcm16": 48_000}
"""Assumed byte rates to turn an audio size into seconds (16 kHz 16-bit mono WAV; 24 kHz PCM16);
any other format is assumed to be 128 kbit/s (16,000 bytes/s). Low rates over-estimate, which is
the safe side."""
FILE_BYTES_PER_TOKEN = 8
"""Estimate for inline files (PDFs...): one token per 8 decoded bytes, at least 85. Rough: PDFs mix
compressed text streams and images."""
FILE_UNKNOWN_TOKENS = 1000
"""Estimate for a file given only by ``file_id`` or URL (content not seen by the proxy)."""


def openai_image_tokens(width: int, height: int, detail: str | None = "auto") -> int:
    """Tokens OpenAI charges for a ``width`` x ``height`` px image (GPT-4o/4.1 vision docs).

    ``detail: low`` -> 85. ``high``/``auto``/unset -> scale to fit in 2048x2048, then scale so the
    shortest side is 768 px (only ever down), then 170 per 512 px tile + 85. (``auto`` is counted
    as ``high``: the upper bound.)
    """
    if detail == "low":
        return IMAGE_LOW_DETAIL_TOKENS
    w, h = float(max(width, 1)), float(max(height, 1))
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    tiles = math.ceil(w / 512) * math.ceil(h / 512)
    return IMAGE_TILE_TOKENS * tiles + IMAGE_BASE_TOKENS


def anthropic_image_tokens(width: int, height: int) -> int:
    """Tokens Anthropic charges for an image (its vision docs): ``width * height / 750`` after
    scaling the long edge down to 1568 px, capped at ``ANTHROPIC_IMAGE_MAX_TOKENS``."""
    w, h = float(max(width, 1)), float(max(height, 1))
    if max(w, h) > 1568:
        scale = 1568 / max(w, h)
        w, h = w * scale, h * scale
    return min(ANTHROPIC_IMAGE_MAX_TOKENS, math.ceil(w * h / 750))


def base64_image_size(payload: str) -> tuple[int, int] | None:
    """``(width, height)`` of a base64-encoded image, or ``None`` if unreadable.

    Decodes only a prefix (4 KiB, then 64 KiB, then all): PNG/GIF/WebP headers sit in the first
    bytes; a JPEG's frame header can follow large EXIF blocks.
    """
    for limit in (4096, 65536, None):
        chunk = payload if limit is None else payload[:limit]
        chunk = "".join(chunk.split())
        chunk = chunk[: len(chunk) // 4 * 4]
        try:
            data = base64.b64decode(chunk)
        except (ValueError, binascii.Error):
            return None
        width, height = imagesize.get(io.BytesIO(data))
        if width > 0 and height > 0:
            return width, height
        if limit is None or len(payload) <= limit:
            return None
    return None


def data_url_payload(url: str) -> str | None:
    """The base64 payload of a ``data:...;base64,`` URL, else ``None``."""
    if not url.startswith("data:"):
        return None
    comma = url.find(",", 0, 256)
    if comma < 0 or ";base64" not in url[:comma]:
        return None
    return url[comma + 1 :]


def _base64_decoded_bytes(payload: str) -> int:
    """Size of the decoded data, without decoding it."""
    payload = payload.rstrip()
    return max(0, len(payload) * 3 // 4 - (len(payload) - len(payload.rstrip("="))))
