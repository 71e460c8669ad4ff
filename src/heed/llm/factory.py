"""Building a provider from settings, per operation.

``build_provider(settings, "reflect")`` reads the ``HEED_REFLECT_LLM_*``
settings, falling back field by field to ``HEED_LLM_*``; ``"turn"`` does the
same with ``HEED_TURN_LLM_*``, and ``"retain"`` (the model that extracts facts
from what is retained, through :func:`heed.llm.structured.complete_json`) with
``HEED_RETAIN_LLM_*``. So the operations can use different providers and models
while sharing, say, one base URL. The fields each operation may override:
``PROVIDER``, ``MODEL``, ``BASE_URL``, ``API_KEY``, ``TIMEOUT``, ``MAX_TOKENS``,
``SCRIPT``; retries, threads and the model cache are shared (``HEED_LLM_*``).

With *gates* (the server's :class:`~heed.llm.gate.ProviderGates`), a remote provider is
wrapped in the :class:`~heed.llm.gate.GatedProvider` of its upstream, so the operations that
share an upstream share its concurrency (``HEED_LLM_CONCURRENCY``).

Build a provider once per server and operation, and ``await provider.aclose()``
at shutdown: the ``openai`` provider owns an HTTP connection pool, and the
``local`` provider's model is loaded once per process whatever the number of
providers (see :mod:`heed.llm.local`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from heed.llm.base import ChatProvider, UnknownProvider
from heed.llm.gate import GatedProvider, ProviderGates
from heed.settings import Settings

__all__ = [
    "OPERATIONS",
    "PROVIDERS",
    "Operation",
    "ProviderConfig",
    "build_provider",
    "providers_of",
    "resolve",
]

Operation = Literal["reflect", "turn", "retain"]
OPERATIONS: Final = ("reflect", "turn", "retain")
PROVIDERS: Final = ("local", "openai", "scripted")


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """The effective provider settings of one operation."""

    provider: str
    model: str
    base_url: str
    api_key: str | None
    timeout: float
    retries: int
    max_tokens: int
    script: str | None
    threads: int
    prefill_threads: int
    cache_dir: Path | None


def resolve(settings: Settings, operation: Operation) -> ProviderConfig:
    """The provider settings of *operation*: its overrides, else the ``llm_*`` defaults."""
    if operation not in OPERATIONS:
        raise ValueError(f"unknown operation {operation!r}; expected one of {OPERATIONS}")

    def pick(name: str) -> Any:
        override = getattr(settings, f"{operation}_llm_{name}", None)
        return override if override is not None else getattr(settings, f"llm_{name}")

    api_key = pick("api_key")
    secret = getattr(api_key, "get_secret_value", None)
    script = pick("script")
    return ProviderConfig(
        provider=str(pick("provider")).strip().lower(),
        model=str(pick("model")).strip(),
        base_url=str(pick("base_url")),
        api_key=secret() if callable(secret) else None,
        timeout=float(pick("timeout")),
        retries=settings.llm_retries,
        max_tokens=int(pick("max_tokens")),
        script=None if script is None else str(script),
        threads=settings.llm_threads,
        prefill_threads=settings.llm_prefill_threads,
        cache_dir=settings.model_cache_dir,
    )


def providers_of(settings: Settings, operations: tuple[Operation, ...]) -> set[str]:
    """The providers (``local``, ``openai``, ``scripted``) that serve *operations*."""
    return {resolve(settings, operation).provider for operation in operations}


def build_provider(
    settings: Settings, operation: Operation = "turn", gates: ProviderGates | None = None
) -> ChatProvider:
    """A provider for *operation* built from *settings* (a remote one behind its upstream's
    gate among *gates*, when given).

    Raises :class:`~heed.llm.base.UnknownProvider` naming the value when the
    provider is not one of ``local``, ``openai``, ``scripted``, and
    :class:`~heed.llm.base.UnknownModel` for a model the provider cannot have
    (checked here where it can be, without any network call).
    """
    config = resolve(settings, operation)
    if config.provider == "scripted":
        from heed.llm.scripted import ScriptedProvider

        return ScriptedProvider(config.script)
    if config.provider == "openai":
        from heed.llm.openai import OpenAIProvider

        provider = OpenAIProvider(
            model=config.model,
            base_url=config.base_url,
            api_key=config.api_key,
            timeout=config.timeout,
            retries=config.retries,
            default_max_tokens=config.max_tokens,
        )
        if gates is None:
            return provider
        return GatedProvider(provider, gates.for_upstream(config.base_url, "openai"))
    if config.provider == "local":
        from heed.llm.local import LocalProvider

        return LocalProvider(
            model=config.model or None,
            threads=config.threads,
            prefill_threads=config.prefill_threads,
            cache_dir=config.cache_dir,
            default_max_tokens=config.max_tokens,
        )
    setting = f"HEED_{operation.upper()}_LLM_PROVIDER or HEED_LLM_PROVIDER"
    raise UnknownProvider(
        f"unknown LLM provider {config.provider!r} ({setting}); "
        f"expected one of: {', '.join(PROVIDERS)}",
        provider=config.provider,
    )
