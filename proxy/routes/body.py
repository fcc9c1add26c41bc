"""Reading a request body with a size limit."""

from __future__ import annotations

from fastapi import Request

from proxy.errors import PayloadTooLarge


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """The whole body; raises ``PayloadTooLarge`` (413) past ``limit_bytes`` without reading it all."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit_bytes:
        raise PayloadTooLarge(f"The request body is larger than this proxy's limit of {limit_bytes} bytes.")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise PayloadTooLarge(f"The request body is larger than this proxy's limit of {limit_bytes} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)
