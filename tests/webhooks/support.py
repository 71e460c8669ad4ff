"""Helpers for the webhook tests: a resolver whose answers the test sets (DNS is outside
heed), and the clients of two tenants."""

from __future__ import annotations

import socket
from collections import Counter
from typing import Any

import anyio._core._sockets as anyio_sockets
import pytest


class FakeDns:
    """Answers for the names the test owns: each call of a name takes the next of its
    addresses (the last one repeats); every other name goes to the real resolver. Patched
    into :func:`socket.getaddrinfo` (what heed resolves with) and anyio's ``getaddrinfo``
    (what httpx resolves with when it is given a name), so a test sees every lookup."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.calls: Counter[str] = Counter()
        real = socket.getaddrinfo

        def lookup(
            host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
        ) -> list[Any]:
            name = host.decode() if isinstance(host, bytes) else host
            if name not in self.answers:
                return real(host, port, family, type, proto, flags)
            given = self.answers[name]
            address = given[min(self.calls[name], len(given) - 1)]
            self.calls[name] += 1
            number = int(port or 0)
            if ":" in address:
                return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, number, 0, 0))]
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, number))]

        async def lookup_async(
            host: Any, port: Any, *, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
        ) -> list[Any]:
            return lookup(host, port, family, type, proto, flags)

        monkeypatch.setattr(socket, "getaddrinfo", lookup)
        monkeypatch.setattr(anyio_sockets, "getaddrinfo", lookup_async)
