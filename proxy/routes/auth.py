"""Credentials and tenancy. Keys are never stored or logged: a tenant is a salted hash of its key.

Clients send their key as ``Authorization: Bearer KEY`` (OpenAI), ``api-key: KEY`` (Azure) or
``x-api-key: KEY`` (Anthropic's Messages API, and Anthropic-style gateways).

With a proxy-held upstream key (``upstream_api_key`` for the OpenAI upstream,
``anthropic_upstream_api_key`` for the Anthropic one) clients present one of ``client_api_keys``;
a request for an upstream whose key the proxy does not hold, while it holds the other's, is refused
(403): forwarding the client's key there would hand a key of this proxy to that provider.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from proxy.errors import Forbidden, Unauthorized
from proxy.settings import Settings

ANONYMOUS = "anonymous"
"""Tenant of requests that carry no key (only possible when the proxy does not hold the upstream key)."""


def client_key(headers: Mapping[str, str]) -> str | None:
    """The API key a client sent, or None (``Authorization: Bearer`` with no token is no key: an
    SDK configured with an empty key sends it, and it must not become a tenant anybody can name)."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer":
            return token.strip() or None
        return auth.strip()
    return headers.get("api-key") or headers.get("x-api-key") or None


def tenant_of(key: str | None, salt: str | hmac.HMAC) -> str:
    """``t_`` + 32 hex of HMAC-SHA256(salt, key): a stable, non-reversible tenant id. ``salt``: the
    salt, or ``keyed(salt)`` (the same id, computed without keying HMAC again)."""
    if not key:
        return ANONYMOUS
    mac = keyed(salt) if isinstance(salt, str) else salt.copy()
    mac.update(key.encode())
    return "t_" + mac.hexdigest()[:32]


def keyed(salt: str) -> hmac.HMAC:
    """HMAC-SHA256 keyed with ``salt`` and nothing hashed yet, for ``tenant_of`` to copy instead of
    keying HMAC (OpenSSL's digest lookup included) for each request: 18,600 instructions a tenant
    id against 25,800 (callgrind), 1.05 us against 1.5 us (timeit). It holds the salt, never a
    client's key."""
    return hmac.new(salt.encode(), digestmod=hashlib.sha256)


TENANTS_KEPT = 1024
"""Keys whose tenant id an ``Authenticator`` remembers (``Authenticator.tenant``; emptied whole
when full)."""


def _split(keys: str) -> list[str]:
    return [k.strip() for k in keys.split(",") if k.strip()]


class Authenticator:
    """Decides who a request is. Keeps only hashes of the configured keys in memory, and of the
    keys it has seen: ``tenant``'s memo (at most ``TENANTS_KEPT``)."""

    def __init__(self, settings: Settings) -> None:
        self._salt = keyed(settings.tenant_salt)
        self._tenants: dict[bytes, str] = {}
        """BLAKE2s digest (256 bits) of a key -> its tenant id (never the key itself)."""
        self._holds_openai_key = settings.upstream_api_key is not None
        self._holds_anthropic_key = settings.anthropic_upstream_api_key is not None
        self._holds_upstream_key = self._holds_openai_key or self._holds_anthropic_key
        self._clients = {tenant_of(k, self._salt) for k in _split(settings.client_api_keys)}
        self._admins = {tenant_of(k, self._salt) for k in _split(settings.admin_api_keys)}

    def chat_tenant(self, headers: Mapping[str, str]) -> str:
        """Tenant of a chat/pass-through request.

        Raises ``Unauthorized`` when the proxy holds the upstream key and the client's key is not
        one of ``client_api_keys`` (or an admin key).
        """
        return self._client_tenant(headers, self._holds_openai_key, "OpenAI", "CONTEXT_PROXY_UPSTREAM_API_KEY")

    def messages_tenant(self, headers: Mapping[str, str]) -> str:
        """Tenant of an Anthropic Messages request (``x-api-key`` or ``Authorization: Bearer``).

        Raises ``Unauthorized`` as ``chat_tenant`` does, and ``Forbidden`` when the proxy holds
        only the OpenAI upstream key (see the module docstring)."""
        return self._client_tenant(headers, self._holds_anthropic_key, "Anthropic",
                                   "CONTEXT_PROXY_ANTHROPIC_UPSTREAM_API_KEY")

    def tenant(self, key: str | None) -> str:
        """``tenant_of(key, salt)``, remembered by the BLAKE2s digest (256 bits) of ``key`` (an HMAC
        per request was about 1% of a small chat request's instructions; hashlib's own BLAKE2s costs
        about 3,000 instructions against 5,500 for OpenSSL's SHA-256, whose per-call digest setup
        dominates a short key, callgrind; the tenant id itself is ``tenant_of``'s HMAC-SHA256).
        The memo holds ``TENANTS_KEPT`` keys' digests at most and is emptied whole when full: keys
        a client makes up cost the others a recomputation, never another tenant's id (a digest
        names one key)."""
        if not key:
            return ANONYMOUS
        digest = hashlib.blake2s(key.encode()).digest()
        tenant = self._tenants.get(digest)
        if tenant is None:
            tenant = tenant_of(key, self._salt)
            if len(self._tenants) >= TENANTS_KEPT:
                self._tenants.clear()
            self._tenants[digest] = tenant
        return tenant

    def _client_tenant(self, headers: Mapping[str, str], holds_this_key: bool, which: str, setting: str) -> str:
        tenant = self.tenant(client_key(headers))
        if self._holds_upstream_key and tenant not in self._clients and tenant not in self._admins:
            raise Unauthorized("Invalid or missing API key for this proxy.")
        if self._holds_upstream_key and not holds_this_key:
            raise Forbidden(f"This proxy holds no {which} upstream key ({setting}), so it cannot forward this request.")
        return tenant

    def reader(self, headers: Mapping[str, str]) -> str | None:
        """Tenant whose data a read-API call may see; ``None`` means an admin (every tenant).

        Raises ``Unauthorized`` for a call with no key: what clients sent without a key (the
        ``anonymous`` tenant, possible only in the pass-through mode) is anybody's who can reach
        the port, so only an admin key reads it. Raises it too, with a proxy-held upstream key, for
        a key that is not one of ``client_api_keys`` (or an admin key)."""
        key = client_key(headers)
        if not key:
            raise Unauthorized("The read API needs a key: send the one your client sends (Authorization: Bearer KEY). "
                               "What was sent without a key is readable with an admin key only.")
        tenant = self.tenant(key)
        if tenant in self._admins:
            return None
        if self._holds_upstream_key and tenant not in self._clients:
            raise Unauthorized("Invalid or missing API key for this proxy.")
        return tenant
