"""The read API fuzzed by schemathesis against the proxy's own ``/openapi.json`` (issue 5, point 3).

Every read and health operation gets generated valid (positive) and invalid (negative) requests,
``CONTEXT_PROXY_SCHEMA_EXAMPLES`` each (bounded), over a real socket, as a tenant that has data.
Checks: schemathesis's ``not_a_server_error`` and ``response_schema_conformance`` (documented
responses match their schema), plus ours: every 4xx is OpenAI's error envelope.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable

import schemathesis
import schemathesis.checks
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi import checks as openapi_checks

from tests.e2e.conftest import CLIENT_KEY, Proxy, Upstream
from tests.reliability.probes import ENVELOPE_KEYS, TALLY

EXAMPLES = int(os.environ.get("CONTEXT_PROXY_SCHEMA_EXAMPLES", "25"))
CHECKS = [schemathesis.checks.not_a_server_error, openapi_checks.response_schema_conformance]


def test_schemathesis_read_api(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    proxy = proxy_factory()
    client = proxy.client()
    for sid in ("s1", "s2"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": f"hello {sid}"}],
                                       extra_headers={"x-session-id": sid})
    schema = schemathesis.openapi.from_url(proxy.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    operations = [op for op in operations if {"read", "health"} & set(op.tags or [])]
    assert len(operations) >= 8, [op.path for op in operations]
    cases: Counter[str] = Counter()
    failures: list[str] = []
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(op.as_strategy(generation_mode=mode))
            def one(case: schemathesis.Case) -> None:
                response = case.call(base_url=proxy.url, headers=headers, timeout=30)
                cases[f"{case.method.upper()} {case.path}"] += 1
                try:
                    case.validate_response(response, checks=CHECKS)
                    if 400 <= response.status_code < 500:
                        assert "application/json" in response.headers["content-type"][0]
                        error = response.json()["error"]
                        assert set(error) >= ENVELOPE_KEYS and isinstance(error["message"], str), error
                except Exception as exc:
                    failures.append(f"{case.method} {case.formatted_path} {case.query}: {str(exc)[:300]}")
                    raise

            with contextlib.suppress(Exception):  # each failure is recorded in ``failures``, asserted below
                one()
    total = sum(cases.values())
    assert len(cases) == len(operations), f"operations never exercised: {cases}"
    TALLY.add("schemathesis_cases", total)
    TALLY.add("schemathesis_failures", len(failures))
    TALLY.add("requests", total)
    TALLY.note("schemathesis_operations", len(operations))
    print(f"\nschemathesis: {total} cases over {len(operations)} operations, {len(failures)} failures")
    assert not failures, failures[:5]
