"""Where the proxy may send a request: the configured upstream only (issue 16, items 6 and 8).

``upstream_base`` normalises and checks the configured ``upstream_url`` once, at start. ``join``
puts a path onto it with yarl (the path and query kept byte for byte as the client wrote them,
never re-encoded) and checks that the result's scheme, host and port are the base's.
``passthrough_target`` checks a pass-through request's raw path before that: what could move a
request elsewhere, on the upstream or on a server behind it (``@``, encoded slashes, backslashes,
dot segments, control characters), and a chat-completions path spelt another way (which would
skip the log), are refused with a 400 in OpenAI's envelope.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

import yarl

from proxy.errors import BadRequest

ALLOWED_SCHEMES = frozenset({"http", "https"})
UPSTREAM_CHAT_PATH = "/chat/completions"
"""Where chat completions go on the upstream (joined onto ``upstream_url``, which ends in ``/v1``
or the provider's own prefix); the client's route is ``proxy.routes.chat.CHAT_ROUTE``."""

_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)
_DOUBLE_ENCODED = re.compile(r"%25(?:25)*(?:2e|2f|5c|3b)", re.IGNORECASE)
"""An encoded ``%`` (once or more) before a dot, slash, backslash or ``;``: a dot segment or
separator for a server that decodes the path once more (``%252e%252e``, ``%252F``, ``%25252e``)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def upstream_base(url: str) -> yarl.URL:
    """``url`` (the ``upstream_url`` setting) normalised: scheme and host lower case, no trailing
    ``/``. Raises ``ValueError`` naming the problem unless it is an absolute ``http``/``https`` URL
    with a host and a valid port, without user info, query or fragment (the messages never
    repeat the URL: it may hold a secret)."""
    try:
        parsed = yarl.URL(url.strip())
        host, port = parsed.host, parsed.port  # yarl checks the port lazily
    except ValueError as exc:
        raise ValueError(f"upstream_url is not a valid URL: {exc}") from None
    if parsed.scheme not in ALLOWED_SCHEMES:
        scheme = parsed.scheme or "a relative URL"
        raise ValueError(f"upstream_url must start with http:// or https:// (not {scheme!r})")
    if not host:
        raise ValueError("upstream_url has no host")
    if parsed.raw_user is not None or parsed.raw_password is not None:
        raise ValueError("upstream_url must not carry user info (user:password@); set upstream_api_key instead")
    if parsed.raw_query_string or parsed.raw_fragment or "?" in url or "#" in url:
        raise ValueError("upstream_url must not have a query or a fragment")
    if port is None:
        raise ValueError("upstream_url has no valid port")
    return yarl.URL.build(scheme=parsed.scheme, authority=parsed.raw_authority,
                          path=parsed.raw_path.rstrip("/"), encoded=True)


def join(base: yarl.URL, target: str) -> yarl.URL:
    """``base`` (from ``upstream_base``) with ``target`` appended to its path: ``target`` starts
    with ``/``, is already percent-encoded and may end in ``?query`` (both kept as they are).
    Raises ``BadRequest`` (400) for a target without its leading ``/`` or a result whose scheme,
    host or port differ from ``base``'s."""
    path, _, query = target.partition("?")
    if not path.startswith("/"):
        raise BadRequest("The request path must start with '/'.")
    url = yarl.URL.build(scheme=base.scheme, authority=base.raw_authority, path=base.raw_path.rstrip("/") + path,
                         query_string=query, encoded=True)
    if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
        raise BadRequest("The request path would leave the configured upstream.")
    return url


def passthrough_target(raw_path: str, query: str, method: str) -> str:
    """The target to send upstream (relative to ``/v1``, with ``?query`` when there is one) for a
    pass-through request whose raw path (percent-encoding kept, Latin-1) is ``raw_path``.

    Raises ``BadRequest`` (400) when the raw path does not start with ``/v1/``; contains ``@``, ``#``, a
    backslash, an encoded ``/`` or ``\\`` (``%2F``, ``%5C``), a control character, a doubly
    encoded ``.``, ``/``, ``\\`` or ``;`` (``%252e``, ``%252F``...), or a ``.``/``..`` segment
    (percent-encoded ones too, and with ``;parameters``: ``..;x``, which Tomcat and Jetty read as
    ``..``); or when it is a ``POST`` to chat completions or to Anthropic's messages spelt another way
    (``chat_path_variant``; ``/v1/messages/``, ``/v1/Messages``, ``/v1/messages;x``: each would skip
    the log)."""
    if not raw_path.startswith("/v1/"):
        raise BadRequest("The request path must start with /v1/.")
    rest = raw_path[3:]
    decoded = unquote(rest, encoding="latin-1")
    if (_ENCODED_SEPARATOR.search(rest) or _DOUBLE_ENCODED.search(rest) or "\\" in decoded or "@" in decoded
            or "#" in rest or _CONTROL.search(decoded)):
        raise BadRequest("The request path contains a character the proxy does not relay "
                         "('@', a backslash, an encoded '/' or '\\', a doubly encoded '.', '/', '\\' or ';', "
                         "or a control character).")
    if any(segment.split(";", 1)[0] in (".", "..") for segment in decoded.split("/")):
        raise BadRequest("The request path must not contain '.' or '..' segments.")
    if method == "POST" and chat_path_variant(decoded):
        raise BadRequest("Send chat completions to POST /v1/chat/completions exactly (this spelling of the path "
                         "is not relayed: it would bypass the proxy's log).")
    if method == "POST" and _segments(decoded) == ["messages"] and decoded != "/messages":
        raise BadRequest("Send messages to POST /v1/messages exactly (this spelling of the path is not relayed: "
                         "it would bypass the proxy's log).")
    return rest + ("?" + query if query else "")


def chat_path_variant(decoded: str) -> bool:
    """True when ``decoded`` (a path after ``/v1``, percent-decoded) names chat completions once
    case, empty segments, ``;parameters``, trailing dots and spaces are ignored:
    ``/chat/completions/``, ``/chat//completions``, ``/chat/completions;x=1``, ``/Chat/Completions.``.
    (The exact ``/chat/completions`` never gets here: the chat route takes it.)"""
    return _segments(decoded) == ["chat", "completions"]


def _segments(decoded: str) -> list[str]:
    """The non-empty segments of ``decoded`` with ``;parameters``, trailing dots and spaces dropped,
    lower case (how servers that forgive a spelling read a path)."""
    segments = [s.split(";", 1)[0].rstrip(". ").lower() for s in decoded.split("/")]
    return [s for s in segments if s]
