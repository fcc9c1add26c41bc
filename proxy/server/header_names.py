"""uvicorn's check of response header names, without its regex search for the names the proxy
sends with every answer.

uvicorn's response cycle (``uvicorn.protocols.http.httptools_impl``) checks each header of each
response with ``if HEADER_RE.search(name): raise RuntimeError(...)`` (and the value with
``HEADER_VALUE_RE``, left as it is). ``install_header_name_check`` puts a ``HeaderNameCheck`` over
that module's ``HEADER_RE``: the same answers, the names of ``SENT_NAMES`` known valid without the
search. ``proxy.server.http_guard.guarded_protocol`` installs it for the proxy's server.
"""

from __future__ import annotations

import re

from uvicorn.protocols.http import httptools_impl

SENT_NAMES = frozenset(name.encode() for name in (
    "server", "date", "content-length", "transfer-encoding", "content-type", "x-request-id", "request-id",
    "openai-processing-ms", "openai-version", "retry-after", "x-context-proxy-session-id",
    "x-context-proxy-request-id", "x-context-proxy-tokens-client", "x-context-proxy-tokens-forwarded",
    "x-context-proxy-defenses", "x-context-proxy-events", "x-context-proxy-overflow-retries",
    "x-context-proxy-overflow", "x-context-proxy-warning"))
"""Response header names (lower case, valid) that most answers carry: uvicorn's own (``server``,
``date``), the framing, the upstream's common ones and the proxy's (the bytes of
``proxy.routes.answer.KNOWN_NAMES``, the very objects most answers carry, are all here)."""


class HeaderNameCheck:
    """Stands in for uvicorn's ``HEADER_RE`` (``uvicorn.protocols.http.httptools_impl``), the pattern
    of the characters a response header name must not hold, which uvicorn's response cycle uses as
    ``if HEADER_RE.search(name): raise RuntimeError(...)`` for every header of every response.
    ``search`` returns what the pattern's ``search`` returns: ``None`` at once for a name of
    ``names`` (a ``bytes`` in which the pattern finds nothing: ``install_header_name_check`` checks),
    else the pattern's own answer. The regex searches of a small answer's nine names were about
    14,000 instructions (callgrind, ``tests/benchmarks``' small chat request: all of a request's
    searches 26,000 before, 12,000 after); a set lookup of a name whose ``bytes`` object keeps its
    hash is a fraction of one. Holds no state but the two constants."""

    __slots__ = ("names", "pattern")

    def __init__(self, pattern: re.Pattern[bytes], names: frozenset[bytes]) -> None:
        self.pattern = pattern
        self.names = names

    def search(self, name: bytes) -> re.Match[bytes] | None:
        if type(name) is bytes and name in self.names:
            return None
        return self.pattern.search(name)

    def __getattr__(self, attribute: str) -> object:
        """Every other attribute is the pattern's (a uvicorn that used ``match`` or ``flags``
        would get the pattern's own answers, not an ``AttributeError`` on every response); not
        this object's own slots or Python's special names (``copy`` and ``pickle`` look those up
        on an object whose slots are not set yet: forwarded, they recursed)."""
        if attribute in ("pattern", "names") or attribute.startswith("__"):
            raise AttributeError(attribute)
        return getattr(self.pattern, attribute)


def install_header_name_check(names: frozenset[bytes] = SENT_NAMES) -> bool:
    """Put a ``HeaderNameCheck`` of ``names`` over uvicorn's ``HEADER_RE`` (once: a second call, or a
    pattern already replaced, changes nothing). Not installed, and ``False`` returned, when uvicorn
    has no such pattern or when it finds something in one of ``names`` (then every name goes
    through it, as before)."""
    current = getattr(httptools_impl, "HEADER_RE", None)
    if isinstance(current, HeaderNameCheck):
        return True
    if not isinstance(current, re.Pattern) or any(current.search(name) for name in names):
        return False
    # (uvicorn calls only its ``search``: the check answers it as the pattern does)
    httptools_impl.HEADER_RE = HeaderNameCheck(current, names)  # type: ignore[assignment]
    return True
