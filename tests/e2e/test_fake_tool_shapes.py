"""A ``tools`` shape the provider refuses (``parameters`` a string...) reaches the client as the
provider's 400, relayed as it came: the fake upstream answers it as OpenAI does instead of
crashing into a 500 the proxy would relay (``tests/fakes/validation.py``)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Proxy, Upstream


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("parameters", ["{}", [1]])
def test_tool_parameters_of_a_wrong_type_are_the_provider_s_400(proxy: Proxy, upstream: Upstream, parameters: object,
                                                                stream: bool) -> None:
    body = {"model": "gpt-4o", "stream": stream, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}]}
    with proxy.http() as http:
        r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["param"] == "tools[0].function.parameters" and error["code"] == "invalid_type"
    assert error["message"].startswith("Invalid type for 'tools[0].function.parameters': expected an object, but got ")
    assert upstream.state.chat_requests[-1].status == 400  # the provider's answer, relayed
