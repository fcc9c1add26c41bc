"""Thin route handlers: parse, call one use case, render."""
