"""proxy/routes/auth.py: tenant ids from keys."""

from __future__ import annotations

import hashlib
import hmac

from proxy.routes.auth import ANONYMOUS, keyed, tenant_of


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
