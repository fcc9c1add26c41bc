"""Media offload: inline ``data:`` images become text references to content-addressed artifacts.

DESIGN.md section 2: inline media of history that is being summarized become references; case
019: after a body-size overflow (HTTP 413), the images of every message but the newest user
message are offloaded too, since text compaction alone cannot shrink the body. A media item that
cannot be stored becomes an explicit error placeholder (DESIGN.md, "fail safe, never silent"):
forwarding the original again would repeat the 413.

Handles OpenAI ``image_url`` parts with a ``data:`` URL and Anthropic ``image`` blocks with a
``base64`` source. Remote ``http(s)`` URLs are small and left alone.
"""

from __future__ import annotations

from typing import Any

from proxy.defenses.offload import ArtifactToStore, artifact_id

UNSTORED_TEXT = "[context-proxy] An image was removed here: it could not be stored, so it is not readable."


def _inline_image(part: Any) -> tuple[str, str] | None:
    """``(data_url, media_type)`` of an inline image part, else ``None``."""
    if not isinstance(part, dict):
        return None
    if part.get("type") == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if isinstance(url, str) and url.startswith("data:"):
            media_type = url[5:].split(";", 1)[0].split(",", 1)[0] or "application/octet-stream"
            return url, media_type
    if part.get("type") == "image":
        source = part.get("source")
        if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
            media_type = str(source.get("media_type") or "application/octet-stream")
            return f"data:{media_type};base64,{source['data']}", media_type
    return None


def has_inline_media(message: dict[str, Any]) -> bool:
    """True if ``message`` has an inline (``data:``/base64) image part."""
    content = message.get("content")
    return isinstance(content, list) and any(_inline_image(p) for p in content)


def reference_text(art_id: str, media_type: str, size_chars: int) -> str:
    """The text part that replaces an offloaded image."""
    return (
        f"[context-proxy] An image ({media_type}, {size_chars} chars inline) was offloaded to artifact "
        f"{art_id}; read it back at /artifacts/{art_id}."
    )


def offload_media(
    message: dict[str, Any], unavailable: frozenset[str] = frozenset()
) -> tuple[dict[str, Any] | None, list[ArtifactToStore]]:
    """Replace inline images of ``message`` by text parts; ``(new message or None, artifacts)``.

    The content list keeps its length and order; each image part becomes ``{"type": "text", ...}``.
    """
    content = message.get("content")
    if not isinstance(content, list):
        return None, []
    artifacts: list[ArtifactToStore] = []
    parts: list[Any] = []
    changed = False
    for part in content:
        found = _inline_image(part)
        if found is None:
            parts.append(part)
            continue
        url, media_type = found
        art_id = artifact_id(url)
        if art_id in unavailable:
            parts.append({"type": "text", "text": UNSTORED_TEXT})
        else:
            artifacts.append(ArtifactToStore(art_id, url, media_type))
            parts.append({"type": "text", "text": reference_text(art_id, media_type, len(url))})
        changed = True
    if not changed:
        return None, []
    return {**message, "content": parts}, artifacts
