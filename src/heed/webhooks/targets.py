"""The SSRF allow-list: where a webhook may send, and the addresses a try connects to.

A target is an ``http`` or ``https`` URL with a host (at most :data:`MAX_URL_CHARS`, no user
or password in it), read the same by :func:`urllib.parse.urlsplit` and by httpx (the
client that sends it): a URL the two read differently is refused. Unless private targets
are allowed (``HEED_WEBHOOK_ALLOW_PRIVATE``), the host is resolved and **every** address it
resolves to must be a public one (:func:`refusal`):

- an address the :mod:`ipaddress` module does not call global (loopback, private,
  link-local such as cloud metadata at 169.254.169.254, shared, documentation,
  benchmarking, unspecified), multicast, or reserved;
- what :mod:`ipaddress` calls global but is not a place to send to: the IETF protocol
  assignments ``192.0.0.0/24`` (it exempts ``192.0.0.9`` and ``.10``), the retired 6to4
  relay anycast ``192.88.99.0/24``, IPv6 site-local ``fec0::/10``, the IPv6 documentation
  prefix ``3fff::/20`` and the local-use NAT64 prefix ``64:ff9b:1::/48``;
- an IPv6 address that embeds an IPv4 one is checked as that IPv4 address: IPv4-mapped
  ``::ffff:0:0/96``, IPv4-compatible ``::/96``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``
  and Teredo ``2001::/32`` (its server and its client), so ``[::127.0.0.1]``,
  ``[64:ff9b::a9fe:a9fe]`` and ``[2002:7f00:1::]`` are refused as 127.0.0.1 and
  169.254.169.254 are.

The check runs when a webhook is created or its URL changed (a refusal is a 400 naming the
URL and the address), and in every try (:func:`resolve`): the host is resolved **once**,
every answer checked, and the try connects to a checked address (the worker pins it; the
``Host`` header and TLS server name stay the URL's host). Each redirect hop is resolved and
checked the same way. So a name whose answers change between the check and the connection
(DNS rebinding) cannot lead a try to an address that was not checked.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Final
from urllib.parse import urlsplit

import httpx

from heed.memory.models import InvalidInput

__all__ = [
    "MAX_URL_CHARS",
    "TargetRefused",
    "check_address",
    "check_target",
    "check_url",
    "refusal",
    "resolve",
]

MAX_URL_CHARS: Final = 2048

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Networks :mod:`ipaddress` calls global that no webhook may target, and why.
_REFUSED: Final = (
    (ipaddress.ip_network("192.0.0.0/24"), "an IETF protocol assignment"),
    (ipaddress.ip_network("192.88.99.0/24"), "the retired 6to4 relay anycast"),
    (ipaddress.ip_network("fec0::/10"), "a site-local address"),
    (ipaddress.ip_network("3fff::/20"), "a documentation address"),
    (ipaddress.ip_network("64:ff9b:1::/48"), "a local-use NAT64 address"),
)
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE: Final = ipaddress.ip_network("::/96")
_NOT_PUBLIC: Final = "a loopback, private, link-local, reserved or otherwise non-public address"


class TargetRefused(InvalidInput):
    """A webhook target outside the allow-list (400, naming the URL and why)."""


def check_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of a well-formed target URL, else :class:`TargetRefused`. The host
    is the one a try resolves and connects to (IDNA-encoded, IPv6 without brackets)."""
    if len(url) > MAX_URL_CHARS:
        raise TargetRefused(f"webhook url has {len(url)} characters; the limit is {MAX_URL_CHARS}")
    try:
        parts = urlsplit(url)
        port = parts.port
        sent = httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as exc:
        raise TargetRefused(f"webhook url {url!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise TargetRefused(f"webhook url {url!r} must be http or https")
    if not parts.hostname:
        raise TargetRefused(f"webhook url {url!r} has no host")
    if parts.username is not None or parts.password is not None or sent.userinfo:
        raise TargetRefused(f"webhook url {url!r} may not carry a user or password")
    if sent.host.lower() != parts.hostname.lower() or sent.port != port:
        raise TargetRefused(
            f"webhook url {url!r} is ambiguous: its host reads as {parts.hostname!r} or "
            f"{sent.host!r}"
        )
    host = sent.raw_host.decode("ascii")
    return host, port or (443 if parts.scheme == "https" else 80)


def refusal(ip: IPAddress) -> str | None:
    """Why *ip* may not be a webhook's target (see the module docstring), or ``None``."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded(ip)
        if embedded:
            for inner in embedded:
                why = refusal(inner)
                if why is not None:
                    return f"{inner} (embedded in {ip}), {why}"
            if ip.teredo is None:  # Teredo: its own prefix is checked too, below
                return None
    for network, why in _REFUSED:
        if ip.version == network.version and ip in network:
            return f"{ip}, {why}"
    if not ip.is_global or ip.is_multicast or ip.is_reserved:
        return f"{ip}, {_NOT_PUBLIC}"
    return None


def _embedded(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses *ip* embeds (mapped, compatible, NAT64, 6to4, Teredo), if any."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):  # not :: or ::1
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    return []


def check_address(url: str, address: str) -> None:
    """Refuse *address* (one answer for *url*'s host) unless it is a public one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    why = refusal(ip)
    if why is not None:
        raise TargetRefused(
            f"webhook url {url!r} resolves to {why}; such targets are refused unless "
            "HEED_WEBHOOK_ALLOW_PRIVATE is set"
        )


def resolve(url: str, allow_private: bool) -> list[str]:
    """Resolve *url*'s host once and check every answer (unless *allow_private*); the
    addresses, in the resolver's order, without repeats. Raises :class:`TargetRefused`
    when the URL is malformed, the host does not resolve, or any answer is refused.
    Blocking (run it off the event loop)."""
    host, port = check_url(url)
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise TargetRefused(
            f"webhook url {url!r}: host {host!r} does not resolve ({exc})"
        ) from None
    addresses = list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in answers))
    if not addresses:
        raise TargetRefused(f"webhook url {url!r}: host {host!r} does not resolve")
    if not allow_private:
        for address in addresses:
            check_address(url, address)
    return addresses


def check_target(url: str, allow_private: bool) -> None:
    """Check *url* against the allow-list (see the module docstring). Blocking: it resolves
    the host (run it off the event loop)."""
    if allow_private:
        check_url(url)
        return
    resolve(url, allow_private)
