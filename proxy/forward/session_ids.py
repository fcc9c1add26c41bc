"""The client's session id (``X-Session-Id``): decoded, checked, never silently changed.

A header's bytes reach the app as Latin-1 text (ASGI); ``header_text`` reads them as UTF-8 when
they are valid UTF-8, so a UTF-8 id is stored as sent and can be read back by the same id.
``client_session_id`` refuses, with a 400 naming the header, an id the read API could not
address: longer than ``MAX_SESSION_ID_CHARS`` characters (cutting it would merge two sessions
that share a prefix), containing ``/`` (a path segment of ``/sessions/{id}/...``: Starlette routes
on the decoded path, so even ``%2F`` splits it, and the archive URL the summary names would
not resolve), or ``.``/``..`` (dot segments that clients remove from URLs).
"""

from __future__ import annotations

from proxy.errors import BadRequest
from proxy.forward.session_log import MAX_SESSION_ID_CHARS

HEADER = "X-Session-Id"


def header_text(latin1: str) -> str:
    """A header value given as ASGI's Latin-1 text, re-read as UTF-8 when its bytes are valid
    UTF-8 (ASCII is unchanged); otherwise as it came."""
    if latin1.isascii():
        return latin1
    raw = latin1.encode("latin-1")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return latin1


def header_value(text: str) -> str:
    """``text`` as a header value to send (ASGI encodes values as Latin-1): the characters whose
    Latin-1 bytes are ``text``'s UTF-8, so a UTF-8 id goes back as the bytes it came as."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("latin-1")


def client_session_id(value: str | None) -> str | None:
    """The session id the client named (surrounding whitespace removed), or ``None`` if it named
    none (absent or blank). Raises ``BadRequest`` (param ``X-Session-Id``) for an id longer than
    ``MAX_SESSION_ID_CHARS`` characters, one containing ``/``, or ``.``/``..``."""
    session_id = (value or "").strip()
    if not session_id:
        return None
    if len(session_id) > MAX_SESSION_ID_CHARS:
        raise BadRequest(
            f"The {HEADER} header is {len(session_id)} characters long; at most {MAX_SESSION_ID_CHARS} are allowed.",
            param=HEADER,
        )
    if "/" in session_id or session_id in (".", ".."):
        raise BadRequest(
            f"The {HEADER} header must not contain '/' or be '.' or '..': the read API could not address the session.",
            param=HEADER,
        )
    return session_id
