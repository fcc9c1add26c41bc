"""Which headers go upstream and which come back (RFC 9110 hop-by-hop rules, the proxy's own, the
operator's account headers under a shared key)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
"""Headers that describe one connection, never forwarded (RFC 9110 section 7.6.1)."""

PROXY_HEADERS = frozenset({"x-session-id"})
"""Headers addressed to this proxy, not to the provider."""

CREDENTIAL_HEADERS = frozenset({"authorization", "api-key", "x-api-key", "openai-organization", "openai-project"})
OVERRIDE_HEADERS = frozenset({"x-http-method-override", "x-http-method", "x-method-override", "x-original-url",
                              "x-rewrite-url", "x-original-method"})
"""Headers some gateways read to change a request's method or path: under the proxy's key they would
let a client reach what the path checks refused, so they are dropped then."""
"""The client's credentials and billed project: replaced by the proxy's key when it holds one (the
client chooses neither the credentials nor the billed project)."""

OWN_RESPONSE_HEADERS = frozenset({"date", "server"})
"""Set by the proxy's own server; the upstream's copies would be duplicates."""

OPERATOR_RESPONSE_HEADERS = frozenset({"openai-organization", "openai-project", "anthropic-organization-id",
                                       "set-cookie"})
OPERATOR_RESPONSE_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")
"""Response headers about the operator's account (its organization, project, rate limits, cookies):
with a shared upstream key (``upstream_api_key``) they are the operator's, never passed to tenants."""


_REQUEST_DROPPED = HOP_BY_HOP | PROXY_HEADERS
_REQUEST_DROPPED_UNDER_KEY = _REQUEST_DROPPED | CREDENTIAL_HEADERS | OVERRIDE_HEADERS
_RESPONSE_DROPPED = HOP_BY_HOP | OWN_RESPONSE_HEADERS
_RESPONSE_DROPPED_DECODED = _RESPONSE_DROPPED | {"content-encoding"}
_NONE: frozenset[str] = frozenset()


def connection_tokens(pairs: Iterable[tuple[str, str]]) -> frozenset[str]:
    """Header names (lower case) listed in the ``Connection`` headers of ``pairs``: hop-by-hop for
    this one connection, so never forwarded (RFC 9110 section 7.6.1)."""
    names: set[str] = set()
    for name, value in pairs:
        if name.lower() == "connection":
            names.update(token.strip().lower() for token in value.split(","))
    names.discard("")
    return frozenset(names)


def forward_request_headers(
    headers: Iterable[tuple[str, str]], *, upstream_api_key: str | None, identity: bool,
    key_header: str = "authorization",
) -> list[tuple[str, str]]:
    """Client headers to send upstream: hop-by-hop (those the ``Connection`` header names too) and
    proxy headers dropped.

    With ``upstream_api_key`` the client's credentials (``CREDENTIAL_HEADERS``) are replaced by the
    proxy's key, sent as ``key_header``: ``authorization`` (``Bearer KEY``, OpenAI) or ``x-api-key``
    (Anthropic); the headers that change a method or path (``OVERRIDE_HEADERS``) are dropped too.
    With ``identity`` the upstream is asked not to compress (the proxy reads chat replies to log them).
    """
    headers = headers if isinstance(headers, (list, tuple)) else list(headers)
    dropped = _REQUEST_DROPPED if upstream_api_key is None else _REQUEST_DROPPED_UNDER_KEY
    out, connection = _forwarded(headers, dropped, _NONE, identity)
    if connection:  # the names it lists go too (then a second pass)
        named = connection_tokens(headers)
        if named:
            out = _forwarded(headers, dropped, named, identity)[0]
    if upstream_api_key is not None:
        out.append((key_header, upstream_api_key if key_header == "x-api-key" else f"Bearer {upstream_api_key}"))
    if identity:
        out.append(("accept-encoding", "identity"))
    return out


def _forwarded(headers: Sequence[tuple[str, str]], dropped: frozenset[str], named: frozenset[str],
               identity: bool) -> tuple[list[tuple[str, str]], bool]:
    """``forward_request_headers``' pass over ``headers`` with ``named`` dropped too (each name
    lowered once): the headers kept, and whether a ``Connection`` header was among them."""
    out: list[tuple[str, str]] = []
    connection = False
    for name, value in headers:
        low = name.lower()
        if (low in dropped or low in named or low.startswith("x-context-proxy-")
                or (identity and low == "accept-encoding")):
            connection = connection or low == "connection"
            continue
        out.append((name, value))
    return out, connection


def response_headers(headers: Mapping[str, str], *, keep_encoding: bool, shared_key: bool = False) -> dict[str, str]:
    """Upstream response headers to pass back (content type, request id, rate limits, retry-after…).

    ``headers``: an ``UpstreamResponse``'s (``httpx.Headers`` or aiohttp's ``CIMultiDictProxy``;
    repeated names joined with ``", "``). Hop-by-hop ones are dropped, those the ``Connection`` header names too; with
    ``shared_key`` (the proxy's own upstream key) the operator's account headers as well
    (``OPERATOR_RESPONSE_HEADERS``)."""
    multi = getattr(headers, "multi_items", None)  # ``httpx.Headers``: each repeated name's value apart
    # (a view, not copied: iterated again only when a ``Connection`` header names more)
    pairs: Iterable[tuple[str, str]] = multi() if multi is not None else headers.items()
    dropped = _RESPONSE_DROPPED if keep_encoding else _RESPONSE_DROPPED_DECODED
    out, connection = _passed_back(pairs, dropped, _NONE, shared_key)
    if connection:  # the names it lists go too (then a second pass)
        named = connection_tokens(pairs)
        if named:
            out = _passed_back(pairs, dropped, named, shared_key)[0]
    return out


def _passed_back(pairs: Iterable[tuple[str, str]], dropped: frozenset[str], named: frozenset[str],
                 shared_key: bool) -> tuple[dict[str, str], bool]:
    """``response_headers``' pass over ``pairs`` with ``named`` dropped too (each name lowered
    once): the headers kept, and whether a ``Connection`` header was among them."""
    out: dict[str, str] = {}
    connection = False
    for name, value in pairs:
        low = name.lower()
        if low in dropped or low in named:
            connection = connection or low == "connection"
            continue
        if shared_key and (low in OPERATOR_RESPONSE_HEADERS or low.startswith(OPERATOR_RESPONSE_PREFIXES)):
            continue
        if low in out:
            out[low] += ", " + value
        else:
            out[low] = value
    return out, connection
