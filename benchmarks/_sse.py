"""A minimal SSE reader for benchmarks: cheap enough that the client is not the bottleneck."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import suppress

__all__ = ["raw_sse"]


async def raw_sse(
    host: str, port: int, path: str, headers: dict[str, str] | None = None
) -> AsyncIterator[tuple[str | None, str, str]]:
    """A minimal SSE reader over a raw socket: yields (id, event, data) per frame.

    Cheap on purpose (no HTTP library on the hot path), so the client is not the
    bottleneck when hundreds of streams share one process.
    """
    reader, writer = await asyncio.open_connection(host, port)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n{extra}\r\n".encode()
    )
    await writer.drain()
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace").splitlines()[0])
        chunked = b"transfer-encoding: chunked" in head.lower()
        buffer = b""
        while True:
            if chunked:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.strip() or b"0", 16)
                if size == 0:
                    return
                chunk = await reader.readexactly(size + 2)
                buffer += chunk[:-2]
            else:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                buffer += chunk
            if b"\n\n" not in buffer:
                continue
            *complete, buffer = buffer.split(b"\n\n")  # one pass, no quadratic copying
            for raw in complete:
                event_id, event, data = None, "message", ""
                for line in raw.decode().split("\n"):
                    if line.startswith("id: "):
                        event_id = line[4:]
                    elif line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        data = line[6:]
                yield event_id, event, data
    finally:
        writer.close()
        with suppress(OSError):
            await writer.wait_closed()
