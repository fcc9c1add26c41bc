"""proxy/routes/auth.py: tenant ids from keys."""

from __future__ import annotations

import hashlib
import hmac

import orjson
import pytest

from proxy.errors import Forbidden, Unauthorized
from proxy.routes.auth import ANONYMOUS, Authenticator, keyed, tenant_of
from proxy.settings import Settings
from proxy.upstream.headers import forward_request_headers, response_headers


def test_a_keyed_salt_gives_the_tenant_ids_of_the_salt_itself() -> None:
    """``tenant_of`` with ``keyed(salt)`` (copied per call) is HMAC-SHA256(salt, key), as with the
    salt; the keyed object is never changed by a call (the next key is not hashed after it)."""
    salt = "per-deployment salt ✓"
    mac = keyed(salt)
    for key in ("sk-bench-client-0123456789", "sk-other", "ünïcode-key", "x" * 300):
        expected = "t_" + hmac.new(salt.encode(), key.encode(), hashlib.sha256).hexdigest()[:32]
        assert tenant_of(key, mac) == tenant_of(key, salt) == expected
    assert tenant_of("sk-bench-client-0123456789", mac) == tenant_of("sk-bench-client-0123456789", salt)
    assert tenant_of(None, mac) == tenant_of("", mac) == ANONYMOUS


def _auth(**settings: object) -> Authenticator:
    return Authenticator(Settings(**settings))  # type: ignore[arg-type]


def test_each_upstream_key_admits_client_keys_and_refuses_the_other_providers_requests() -> None:
    """A proxy-held key for one provider: clients present a client key on both APIs, and the API whose
    key the proxy does not hold is refused (403), never sent the client's key of this proxy."""
    client = {"authorization": "Bearer sk-proxy-client"}
    anthropic_only = _auth(anthropic_upstream_api_key="sk-ant-op", client_api_keys="sk-proxy-client")
    assert anthropic_only.messages_tenant({"x-api-key": "sk-proxy-client"}) == anthropic_only.messages_tenant(client)
    with pytest.raises(Forbidden, match="CONTEXT_PROXY_UPSTREAM_API_KEY"):
        anthropic_only.chat_tenant(client)
    with pytest.raises(Unauthorized):
        anthropic_only.messages_tenant({"x-api-key": "sk-stranger"})
    openai_only = _auth(upstream_api_key="sk-oai-op", client_api_keys="sk-proxy-client")
    assert openai_only.chat_tenant(client).startswith("t_")
    with pytest.raises(Forbidden, match="CONTEXT_PROXY_ANTHROPIC_UPSTREAM_API_KEY"):
        openai_only.messages_tenant(client)
    both = _auth(upstream_api_key="sk-oai-op", anthropic_upstream_api_key="sk-ant-op", client_api_keys="sk-proxy-client")
    assert both.chat_tenant(client) == both.messages_tenant(client)
    open_proxy = _auth()
    assert open_proxy.messages_tenant({"x-api-key": "sk-ant-user"}) == open_proxy.chat_tenant({"x-api-key": "sk-ant-user"})


def test_a_held_anthropic_key_goes_as_x_api_key_and_the_clients_credentials_stay_behind() -> None:
    """Under the proxy's key the client's credentials and the headers gateways read to change the
    method or the path (found by breaking it: ``x-http-method-override`` went upstream) stay behind."""
    sent = forward_request_headers([("x-api-key", "sk-client"), ("Authorization", "Bearer sk-client"),
                                    ("anthropic-version", "2023-06-01"), ("X-HTTP-Method-Override", "DELETE"),
                                    ("x-original-url", "/v1/files"), ("anthropic-beta", "a,b")],
                                   upstream_api_key="sk-ant-op", identity=False, key_header="x-api-key")
    assert sent == [("anthropic-version", "2023-06-01"), ("anthropic-beta", "a,b"), ("x-api-key", "sk-ant-op")]
    shared = response_headers({"request-id": "req_1", "anthropic-ratelimit-tokens-limit": "9", "retry-after": "3",
                               "anthropic-organization-id": "org"}, keep_encoding=True, shared_key=True)
    assert shared == {"request-id": "req_1", "retry-after": "3"}


def test_the_anthropic_envelope_and_the_anthropic_upstream_setting() -> None:
    from proxy.errors import ProxyBusy, UpstreamTimeout

    assert orjson.loads(UpstreamTimeout("slow").anthropic_body()) == {
        "type": "error", "error": {"type": "timeout_error", "message": "slow"}}
    assert orjson.loads(ProxyBusy("full").anthropic_body())["error"]["type"] == "api_error"
    assert orjson.loads(Forbidden("no").anthropic_body())["error"]["type"] == "permission_error"
    with pytest.raises(ValueError, match="ends in /v1"):
        Settings(anthropic_upstream_url="https://api.anthropic.com/v1/")
    assert Settings(anthropic_upstream_url="https://GW.example/anthropic/").anthropic_upstream_url == \
        "https://gw.example/anthropic"


def test_the_tenant_memo_gives_tenant_of_keeps_no_key_and_stays_within_its_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``Authenticator.tenant`` answers ``tenant_of``'s id from its memo on a key's second request
    (no HMAC then), keyed by the key's SHA-256 (the key itself is nowhere in it), and is emptied
    whole at ``TENANTS_KEPT`` keys."""
    import proxy.routes.auth as auth_module

    auth = _auth(tenant_salt="memo salt")
    computed: list[str] = []
    real = auth_module.tenant_of

    def counting(key: str | None, salt: str | hmac.HMAC) -> str:
        computed.append(str(key))
        return real(key, salt)

    monkeypatch.setattr(auth_module, "tenant_of", counting)
    keys = ["sk-first-0123456789", "sk-second-0123456789", "ünïcode-key"]
    for key in keys:
        assert auth.tenant(key) == real(key, "memo salt")  # computed
    assert computed == keys
    for key in keys:
        assert auth.tenant(key) == real(key, "memo salt")  # remembered: no HMAC
        assert auth.chat_tenant({"authorization": f"Bearer {key}"}) == real(key, "memo salt")
    assert computed == keys
    assert auth.tenant(None) == auth.tenant("") == ANONYMOUS
    memo = auth._tenants
    assert set(memo) == {hashlib.blake2s(k.encode()).digest() for k in keys}  # 256-bit digests, never the keys
    assert not any(k in repr(memo) for k in keys)
    for i in range(auth_module.TENANTS_KEPT + 5):
        auth.tenant(f"sk-made-up-{i}")
    assert len(memo) <= auth_module.TENANTS_KEPT
