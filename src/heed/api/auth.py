"""Who is asking: API keys, the web UI's session cookie, the Host allow-list and /metrics.

The model (``docs/security.md`` explains it for operators):

- **No keys** (``HEED_API_KEYS`` empty, the embedded default): only loopback
  clients are served, and only with a ``Host`` header in the allow-list
  (``HEED_ALLOWED_HOSTS``, loopback names by default). The allow-list is what
  stops DNS rebinding: a web page on ``attacker.example`` that resolves its name
  to 127.0.0.1 sends ``Host: attacker.example`` and is refused.
- **Keys**: every request carries ``Authorization: Bearer <key>``, which names
  its tenant, or the UI's session cookie. ``POST /v1/auth/login`` with a key sets
  ``heed_session`` (HttpOnly, SameSite=Strict): the tenant's key hash, a random
  session id and a timestamp, signed with the key itself, so every instance can
  verify it without shared state and removing a key from ``HEED_API_KEYS`` ends
  its sessions. Logging out ends one session everywhere: its id is recorded in
  the database and refused from then on (:mod:`heed.api.revocations`). A
  cookie-authenticated request that changes something must also send
  ``X-Heed-CSRF`` equal to the ``heed_csrf`` cookie (double submit; the value
  is derived from the session, so nothing is stored).
- **Public paths** answer without credentials and reveal nothing: ``/health``,
  the UI's static page and assets, and the login endpoint.
- ``/metrics`` aggregates every tenant's traffic, so with keys it needs the
  operator's ``HEED_METRICS_KEY``; a tenant key is refused.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from typing import Final

from itsdangerous import BadSignature, TimestampSigner

from heed.runtime import DEFAULT_TENANT

__all__ = [
    "ANONYMOUS_TENANT",
    "CSRF_COOKIE",
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "Authenticator",
    "Identity",
    "Refusal",
    "UISession",
]

SESSION_COOKIE: Final = "heed_session"
CSRF_COOKIE: Final = "heed_csrf"
CSRF_HEADER: Final = "x-heed-csrf"
ANONYMOUS_TENANT: Final = ""
"""The tenant of a request to a public path without credentials: it owns nothing."""

LOOPBACK_HOSTS: Final = ("localhost", "127.0.0.1", "::1")
_PUBLIC_PATHS: Final = frozenset(
    {"/", "/health", "/health/live", "/health/ready", "/v1/auth/login", "/v1/auth/session"}
)
_PUBLIC_PREFIXES: Final = ("/ui/",)
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_SALT: Final = "heed-ui-session"


def principal_of(key: str) -> str:
    """The stable, non-secret name of an API key (its SHA-256 prefix)."""
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:12]


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def _host_name(host_header: str) -> str:
    """``Host`` without its port, lower-cased (``[::1]:8700`` -> ``::1``)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


@dataclass(frozen=True, slots=True)
class Identity:
    """An admitted request: its tenant and principal (None without keys or when public)."""

    tenant: str
    principal: str | None
    via_cookie: bool = False
    #: The UI session's id when the request came with a session cookie.
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused, as the HTTP status and message to answer with."""

    status: int
    message: str


@dataclass(frozen=True, slots=True)
class UISession:
    """What ``POST /v1/auth/login`` hands the browser."""

    tenant: str
    session_cookie: str
    csrf_token: str
    max_age: int


class Authenticator:
    """Decides who a request is (see the module docstring). Pure: no I/O, no state."""

    def __init__(
        self,
        api_keys: dict[str, str],
        *,
        allowed_hosts: list[str] | None = None,
        metrics_key: str | None = None,
        session_seconds: int = 12 * 3600,
    ) -> None:
        self.api_keys = dict(api_keys)
        self._keys_by_principal = {principal_of(k).removeprefix("key:"): k for k in api_keys}
        self.metrics_key = metrics_key or None
        self.session_seconds = session_seconds
        if allowed_hosts:
            hosts = [h.strip().lower() for h in allowed_hosts if h.strip()]
            self.allowed_hosts: frozenset[str] | None = (
                None if "*" in hosts else frozenset(_host_name(h) for h in hosts)
            )
        elif api_keys:
            self.allowed_hosts = None  # a key, not the Host name, is what admits a caller
        else:
            self.allowed_hosts = frozenset(LOOPBACK_HOSTS)

    @property
    def keys_required(self) -> bool:
        return bool(self.api_keys)

    # -- the decision ------------------------------------------------------------------

    def identify(
        self, method: str, path: str, headers: list[tuple[bytes, bytes]], client_host: str | None
    ) -> Identity | Refusal:
        """The request's identity, or why it is refused."""
        host = _header(headers, b"host")
        if self.allowed_hosts is not None and host is not None:
            name = _host_name(host)
            if name not in self.allowed_hosts:
                return Refusal(
                    400,
                    f"Host {name!r} is not allowed; this server answers only "
                    f"{', '.join(sorted(self.allowed_hosts))} (set HEED_ALLOWED_HOSTS)",
                )
        if path == "/metrics":
            return self._metrics_identity(headers, client_host)
        if not self.api_keys:
            if not _is_loopback(client_host):
                return Refusal(
                    403,
                    "this server has no API keys configured and serves loopback clients only; "
                    "set HEED_API_KEYS to accept remote clients",
                )
            return Identity(DEFAULT_TENANT, None)
        authorization = _header(headers, b"authorization")
        if authorization is not None:
            return self._bearer_identity(authorization)
        cookie = self._cookie_identity(method, headers)
        if path in _PUBLIC_PATHS or path.startswith(_PUBLIC_PREFIXES):
            # A cookie that no longer verifies (expired, its key revoked) must not lock the
            # browser out of the page and the login that would replace it: JS cannot clear
            # an HttpOnly cookie.
            return cookie if isinstance(cookie, Identity) else Identity(ANONYMOUS_TENANT, None)
        if cookie is not None:
            return cookie
        return Refusal(401, "missing Authorization: Bearer <key> header (or log in at /)")

    def _bearer_identity(self, authorization: str) -> Identity | Refusal:
        scheme, _, key = authorization.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return Refusal(401, "the Authorization header must be 'Bearer <key>'")
        tenant = self.api_keys.get(key)
        if tenant is None:
            return Refusal(401, "unknown API key")
        return Identity(tenant, principal_of(key))

    def _cookie_identity(
        self, method: str, headers: list[tuple[bytes, bytes]]
    ) -> Identity | Refusal | None:
        cookies = _cookies(headers)
        value = cookies.get(SESSION_COOKIE)
        if not value:
            return None
        verified = self._verify_session(value)
        if verified is None:
            return Refusal(401, "the UI session has expired or its key was revoked; log in again")
        key, session_id, _ = verified
        if method not in _SAFE_METHODS:
            sent = _header(headers, CSRF_HEADER.encode()) or ""
            # bytes, not str: compare_digest refuses non-ASCII str (a client-chosen 500)
            if not hmac.compare_digest(sent.encode(), self._csrf_for(key, value).encode()):
                return Refusal(403, "missing or wrong X-Heed-CSRF header for a cookie session")
        return Identity(
            self.api_keys[key], principal_of(key), via_cookie=True, session_id=session_id
        )

    def _metrics_identity(
        self, headers: list[tuple[bytes, bytes]], client_host: str | None
    ) -> Identity | Refusal:
        if not self.api_keys:
            if not _is_loopback(client_host):
                return Refusal(403, "/metrics serves loopback clients only without API keys")
            return Identity(DEFAULT_TENANT, None)
        if self.metrics_key is None:
            return Refusal(403, "/metrics shows every tenant's traffic; set HEED_METRICS_KEY")
        scheme, _, key = (_header(headers, b"authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            key.strip().encode(), self.metrics_key.encode()
        ):
            return Refusal(403, "/metrics needs the HEED_METRICS_KEY bearer key")
        return Identity(ANONYMOUS_TENANT, "metrics")

    # -- UI sessions -------------------------------------------------------------------

    def login(self, key: str) -> UISession | None:
        """A signed UI session for *key*, or None if it is not a configured key."""
        tenant = self.api_keys.get(key)
        if tenant is None:
            return None
        session_id = secrets.token_urlsafe(16)
        payload = f"{principal_of(key).removeprefix('key:')}-{session_id}"
        value = self._signer(key).sign(payload).decode()
        return UISession(
            tenant=tenant,
            session_cookie=value,
            csrf_token=self._csrf_for(key, value),
            max_age=self.session_seconds,
        )

    def csrf_token(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """The CSRF token of the request's valid session cookie, if any."""
        value = _cookies(headers).get(SESSION_COOKIE)
        verified = self._verify_session(value) if value else None
        return None if verified is None or value is None else self._csrf_for(verified[0], value)

    def session_of(self, headers: list[tuple[bytes, bytes]]) -> tuple[str, float] | None:
        """The id of the request's valid UI session and when it expires (epoch seconds)."""
        value = _cookies(headers).get(SESSION_COOKIE)
        verified = self._verify_session(value) if value else None
        if verified is None:
            return None
        _, session_id, signed_at = verified
        return session_id, signed_at + self.session_seconds

    def _verify_session(self, value: str) -> tuple[str, str, float] | None:
        """The key, session id and signing time of a session cookie that verifies."""
        prefix, _, rest = value.partition(".")[0].partition("-")
        key = self._keys_by_principal.get(prefix)
        if key is None or not rest:
            return None  # a cookie from before session ids: log in again
        try:
            _, signed_at = self._signer(key).unsign(
                value, max_age=self.session_seconds, return_timestamp=True
            )
        except BadSignature:  # SignatureExpired is a BadSignature
            return None
        return key, rest, signed_at.timestamp()

    @staticmethod
    def _signer(key: str) -> TimestampSigner:
        return TimestampSigner(key, salt=_SALT)

    @staticmethod
    def _csrf_for(key: str, session_value: str) -> str:
        return hmac.new(key.encode(), b"csrf:" + session_value.encode(), "sha256").hexdigest()


def _cookies(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    raw = _header(headers, b"cookie")
    if not raw:
        return {}
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw)
    except CookieError:
        return {}
    return {name: morsel.value for name, morsel in jar.items()}


@functools.lru_cache(maxsize=1024)  # parsing an address costs more than the rest of auth
def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host in {"localhost", "testclient"}
