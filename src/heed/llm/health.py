"""LLM connectivity probes: does the provider each operation uses answer at all?

``POST .../health/llm`` (hindsight-client's ``test_bank_llm``) probes the provider of each
operation a bank's work uses (:class:`LlmHealth`: ``retain``, ``consolidation``,
``reflect``) with one minimal real call: a one-token completion, under the request's token
and a short deadline (:data:`PROBE_TIMEOUT`). Operations served by the same provider are
probed once, the result reported for each. Each answer is a status only, in Hindsight's
words, never the provider, model, endpoint, key or raw error (those are logged):

- ``connected``: the call completed (``latency_ms`` measured);
- ``not_configured``: no provider can be built for the operation (its settings name an
  unknown provider or model);
- ``auth_failed``: the upstream refused the key (401 or 403);
- ``timeout``: no answer within the deadline or the provider's own timeout;
- ``unreachable``: any other failure (unreachable, 5xx, a broken stream, a local error).

A client that leaves stops the probe under way (its token is the request's) and none after
it starts: the cancellation propagates, it is never reported as a status.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from heed.llm.base import (
    ChatMessage,
    ChatProvider,
    ProviderError,
    UnknownModel,
    UnknownProvider,
    UpstreamTimedOut,
    complete,
)
from heed.runtime import (
    OperationCancelled,
    current_context,
    raise_if_cancelled,
    reraise_cancellation,
    use_context,
)

__all__ = ["PROBE_TIMEOUT", "STATUSES", "LlmHealth", "Probe", "probe_provider"]

log = logging.getLogger(__name__)

#: Seconds one probe may take.
PROBE_TIMEOUT: Final = 10.0
STATUSES: Final = ("connected", "not_configured", "auth_failed", "unreachable", "timeout")
_AUTH_STATUSES: Final = (401, 403)


@dataclass(frozen=True, slots=True)
class Probe:
    """One probe's outcome: a status of :data:`STATUSES` and the time it took."""

    status: str
    latency_ms: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "connected"


def _elapsed(start: float) -> float:
    return round((time.monotonic() - start) * 1000, 3)


async def probe_provider(provider: ChatProvider, seconds: float = PROBE_TIMEOUT) -> Probe:
    """One one-token completion from *provider* within *seconds* (a child token's deadline,
    which stops the call). Raises ``OperationCancelled`` only when the caller's own token
    was cancelled."""
    start = time.monotonic()
    ctx = current_context()
    bounded = ctx.with_timeout(seconds)
    try:
        with use_context(bounded):
            await complete(provider, [ChatMessage.user("ping")], max_tokens=1, temperature=0.0)
        return Probe("connected", _elapsed(start))
    except OperationCancelled:
        if ctx.token.cancelled:
            raise
        return Probe("timeout", _elapsed(start))  # the probe's own deadline
    except UpstreamTimedOut:
        return Probe("timeout", _elapsed(start))
    except ProviderError as exc:
        log.warning("LLM probe of %s failed: %s", provider.name, exc.message)
        refused = exc.upstream_status in _AUTH_STATUSES
        return Probe("auth_failed" if refused else "unreachable", _elapsed(start))
    except Exception as exc:  # noqa: BLE001 - any failure is a status, never an answer's 500
        reraise_cancellation(exc)
        log.warning("LLM probe of %s failed: %r", provider.name, exc)
        return Probe("unreachable", _elapsed(start))
    finally:
        bounded.token.release_parent()


@dataclass
class LlmHealth:
    """The operations whose providers a bank's work uses, each with how its provider is
    had (built on first use: its error is the operation's), and the probe's deadline."""

    operations: Sequence[tuple[str, Callable[[], ChatProvider]]]
    timeout: float = PROBE_TIMEOUT

    async def check(self) -> list[tuple[str, Probe]]:
        """Each operation with its probe, in order (a provider shared by several is probed
        once); see the module docstring."""
        probed: dict[int, Probe] = {}
        out: list[tuple[str, Probe]] = []
        for operation, factory in self.operations:
            raise_if_cancelled()
            try:
                provider = factory()
            except (UnknownProvider, UnknownModel):
                out.append((operation, Probe("not_configured")))
                continue
            except Exception as exc:  # noqa: BLE001 - a provider that cannot be built is a status
                reraise_cancellation(exc)
                log.warning("the %s LLM provider cannot be built: %r", operation, exc)
                out.append((operation, Probe("unreachable")))
                continue
            key = id(provider)
            if key not in probed:
                probed[key] = await probe_provider(provider, self.timeout)
            out.append((operation, probed[key]))
        return out
