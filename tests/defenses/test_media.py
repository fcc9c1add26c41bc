"""Media offload (proxy/defenses/media.py): inline images become references (case 019)."""

from __future__ import annotations

from proxy.conversation.chat_codec import CHAT
from proxy.defenses.media import UNSTORED_TEXT, offload_media
from proxy.defenses.offload import artifact_id

DATA_URL = "data:image/png;base64," + "iVBORw0K" * 1000


def screenshot(url: str = DATA_URL) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": "Screenshot 1"}, {"type": "image_url", "image_url": {"url": url}}]}


def test_inline_image_becomes_a_text_reference():
    message = screenshot()
    new, artifacts = offload_media(message, codec=CHAT)
    assert [p["type"] for p in new["content"]] == ["text", "text"]
    assert new["content"][0] is message["content"][0]
    art = artifacts[0]
    assert art.id == artifact_id(DATA_URL) and art.content == DATA_URL and art.media_type == "image/png"
    assert f"/artifacts/{art.id}" in new["content"][1]["text"]
    assert message["content"][1]["type"] == "image_url"  # input untouched


def test_remote_images_and_plain_text_are_left_alone():
    assert offload_media(screenshot("https://example.com/x.png"), codec=CHAT) == (None, [])
    assert offload_media({"role": "user", "content": "text"}, codec=CHAT) == (None, [])


def test_anthropic_base64_image_block():
    message = {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"}}]}
    new, artifacts = offload_media(message, codec=CHAT)
    assert artifacts[0].media_type == "image/jpeg" and artifacts[0].content == "data:image/jpeg;base64,QUJD"
    assert new["content"][0]["type"] == "text"


def test_unstorable_image_becomes_an_explicit_error_placeholder():
    new, artifacts = offload_media(screenshot(), frozenset({artifact_id(DATA_URL)}), codec=CHAT)
    assert artifacts == [] and new["content"][1] == {"type": "text", "text": UNSTORED_TEXT}


def test_a_media_type_the_client_names_past_rfc_6838_becomes_octet_stream():
    """The media type becomes the stub's text and an indexed column: one of 5,000 characters, one
    with spaces or quotes, or none at all reads as application/octet-stream; a real one is kept."""
    hostile = ["image/" + "p" * 5000, "image/png\" onerror=\"x", "", "png", 42]
    for media_type in hostile:
        url = f"data:{media_type};base64,QUJD" if isinstance(media_type, str) else "data:;base64,QUJD"
        new, artifacts = offload_media(screenshot(url), codec=CHAT)
        assert artifacts[0].media_type == "application/octet-stream", media_type
        assert artifacts[0].content == url  # the chat URL is stored as sent
        assert len(new["content"][1]["text"]) < 400
        block = {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": "QUJD"}}
        _, artifacts = offload_media({"role": "user", "content": [block]}, codec=CHAT)
        assert artifacts[0].media_type == "application/octet-stream"
        assert artifacts[0].content == "data:application/octet-stream;base64,QUJD"
    _, artifacts = offload_media(screenshot("data:image/svg+xml;base64,QUJD"), codec=CHAT)
    assert artifacts[0].media_type == "image/svg+xml"
