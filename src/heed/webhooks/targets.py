"""The SSRF allow-list: where a webhook may send.

A target is an ``http`` or ``https`` URL with a host (at most :data:`MAX_URL_CHARS`, no user
or password in it). Unless private targets are allowed (``HEED_WEBHOOK_ALLOW_PRIVATE``),
the host is resolved and **every** address it resolves to must be a public (global) one: an
address that is loopback, private, link-local (cloud metadata at 169.254.169.254), shared,
reserved, multicast or unspecified refuses the target, also as an IPv4 address mapped into
IPv6. The check runs when a webhook is created or its URL changed (a refusal is a 400 naming
the URL and the address), and again before every try, for each redirect hop too (a
redirect to a refused address fails the delivery): DNS may have changed since.

What remains: the HTTP client resolves the name again when it connects, so a name whose
answers change between the check and the connection (DNS rebinding within one try) is not
caught; heed checks every answer of the name, right before each try.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Final
from urllib.parse import urlsplit

from heed.memory.models import InvalidInput

__all__ = ["MAX_URL_CHARS", "TargetRefused", "check_address", "check_target", "check_url"]

MAX_URL_CHARS: Final = 2048


class TargetRefused(InvalidInput):
    """A webhook target outside the allow-list (400, naming the URL and why)."""


def check_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of a well-formed target URL, else :class:`TargetRefused`."""
    if len(url) > MAX_URL_CHARS:
        raise TargetRefused(f"webhook url has {len(url)} characters; the limit is {MAX_URL_CHARS}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetRefused(f"webhook url {url!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise TargetRefused(f"webhook url {url!r} must be http or https")
    if not parts.hostname:
        raise TargetRefused(f"webhook url {url!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused(f"webhook url {url!r} may not carry a user or password")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def check_address(url: str, address: str) -> None:
    """Refuse *address* (one answer for *url*'s host) unless it is a global one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    if not ip.is_global or ip.is_multicast:
        raise TargetRefused(
            f"webhook url {url!r} resolves to {ip}, a loopback, private, link-local or "
            "reserved address; such targets are refused unless HEED_WEBHOOK_ALLOW_PRIVATE is set"
        )


def check_target(url: str, allow_private: bool) -> None:
    """Check *url* against the allow-list (see the module docstring). Blocking: it resolves
    the host (run it off the event loop)."""
    host, port = check_url(url)
    if allow_private:
        return
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise TargetRefused(
            f"webhook url {url!r}: host {host!r} does not resolve ({exc})"
        ) from None
    if not answers:
        raise TargetRefused(f"webhook url {url!r}: host {host!r} does not resolve")
    for *_, sockaddr in answers:
        check_address(url, str(sockaddr[0]))
