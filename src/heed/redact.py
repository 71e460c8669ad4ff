"""Secrets out of messages: what an error or a log line may say about a URL or a key.

A connection URL carries its password three ways (``postgresql://u:pw@h/db``,
``?password=pw``, or libpq's ``password=pw`` key-value form), and drivers and validators
echo what they were given. Every message that can reach stderr or a log and was built
from configuration passes through :func:`redact` with the secrets :func:`secrets_of` finds
in that configuration; :func:`safe_url` is a URL fit to print.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

__all__ = ["MASK", "redact", "safe_url", "secrets_of"]

MASK: Final = "***"
_KEYWORD_PASSWORD: Final = re.compile(r"(?i)\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")
_QUERY_PASSWORD: Final = re.compile(r"(?i)([?&]password=)[^&#\s]*")
_USERINFO: Final = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/@\s:]*:)[^@\s]*@")


def secrets_of(value: str | None) -> list[str]:
    """The passwords *value* (a URL or a libpq conninfo string) carries, raw and decoded."""
    if not value:
        return []
    found: list[str] = []
    try:
        parts = urlsplit(value)
        if parts.password:
            found.append(parts.password)
        found.extend(v for k, v in parse_qsl(parts.query) if k.lower() == "password" and v)
    except ValueError:  # not a URL (a conninfo string), or one urlsplit refuses
        pass
    found.extend(m.group(1).strip("'") for m in _KEYWORD_PASSWORD.finditer(value))
    for m in _QUERY_PASSWORD.finditer(value):
        found.append(value[m.end(1) : m.end()])
    found.extend([unquote(s) for s in found])
    return [s for s in dict.fromkeys(found) if s]


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """*text* with every one of *secrets*, and any password shape it recognises, masked."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret:
            text = text.replace(secret, MASK)
    text = _USERINFO.sub(rf"\g<1>{MASK}@", text)
    text = _QUERY_PASSWORD.sub(rf"\g<1>{MASK}", text)
    return _KEYWORD_PASSWORD.sub(f"password={MASK}", text)


def safe_url(url: str) -> str:
    """*url* with its password (user-info or query) masked; fit for a message."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:{MASK}@{parts.hostname or ''}"
        if parts.port:
            netloc += f":{parts.port}"
    return redact(urlunsplit(parts._replace(netloc=netloc)), secrets_of(url))
