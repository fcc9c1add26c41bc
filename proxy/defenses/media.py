"""Media offload: inline ``data:`` images become text references to content-addressed artifacts.

DESIGN.md section 2: inline media of history that is being summarized become references; case
019: after a body-size overflow (HTTP 413), the images of every message but the newest user
message are offloaded too, since text compaction alone cannot shrink the body. A media item that
cannot be stored becomes an explicit error placeholder (DESIGN.md, "fail safe, never silent"):
forwarding the original again would repeat the 413.

The defense reads no native key: the codec says which ``MEDIA`` parts are inline
(``Codec.inline_media``: for chat and Messages, OpenAI ``image_url`` parts with a ``data:`` URL and
Anthropic ``image`` blocks with a ``base64`` source; remote ``http(s)`` URLs are small and left
alone) and builds the text part that replaces one (``Codec.text_part``).
"""

from __future__ import annotations

from proxy.conversation.codec import UNCOUNTED, Codec
from proxy.conversation.model import MEDIA, Piece
from proxy.defenses.offload import ArtifactToStore, artifact_id

UNSTORED_TEXT = "[context-proxy] An image was removed here: it could not be stored, so it is not readable."


def reference_text(art_id: str, media_type: str, size_chars: int) -> str:
    """The text part that replaces an offloaded image."""
    return (
        f"[context-proxy] An image ({media_type}, {size_chars} chars inline) was offloaded to artifact "
        f"{art_id}; read it back at /artifacts/{art_id}."
    )


def offload_media(
    message: Piece, unavailable: frozenset[str] = frozenset(), *, codec: Codec,
) -> tuple[Piece | None, list[ArtifactToStore]]:
    """Replace the inline media of ``message`` (a piece of ``codec``) by text parts; ``(new piece or
    None, artifacts)``.

    Decided over the codec's parts: each ``MEDIA`` part ``codec.inline_media`` reads becomes
    ``codec.text_part(reference)`` in its place (``codec.with_parts``), and so does each inline
    media inside a part (``codec.inner_media``: a tool result's image, the part kept, its pairing
    with it): the content keeps its length and order, every other part and key is kept as sent.
    """
    artifacts: list[ArtifactToStore] = []
    new: dict[int, object] = {}

    def reference(url: str, media_type: str) -> object:
        art_id = artifact_id(url)
        if art_id in unavailable:
            return codec.text_part(UNSTORED_TEXT)
        artifacts.append(ArtifactToStore(art_id, url, media_type))
        return codec.text_part(reference_text(art_id, media_type, len(url)))

    for index, part in enumerate(codec.parts(message, UNCOUNTED)):
        found = codec.inline_media(part) if part.kind == MEDIA else None
        if found is not None:
            new[index] = reference(*found)
        elif inner := codec.inner_media(part):  # inside a part: a tool result's screenshot
            new[index] = codec.with_inner(part, {j: reference(url, media_type) for j, url, media_type in inner})
    if not new:
        return None, []
    return codec.with_parts(message, new), artifacts
