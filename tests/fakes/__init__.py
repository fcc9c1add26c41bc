"""Test doubles that run as real servers: a strict fake OpenAI-compatible upstream
(``tests.fakes.upstream``) and a generic uvicorn runner (``tests.fakes.server``)."""
