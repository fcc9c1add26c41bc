"""Reliability and security tests (issue 5); ``python -m tests.reliability --out RELIABILITY.md`` writes the report."""
