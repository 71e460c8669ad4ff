"""build_provider: per-operation settings and clear errors for unknown providers/models."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI

from heed.api.errors import install_error_handlers
from heed.llm import (
    BadModelOutput,
    ChatMessage,
    ScriptedProvider,
    UnknownModel,
    UnknownProvider,
    UpstreamRateLimited,
    UpstreamUnavailable,
    complete,
)
from heed.llm.factory import build_provider, resolve
from heed.llm.openai import OpenAIProvider
from heed.settings import Settings

MakeSettings = Callable[..., Settings]


def test_defaults_are_the_local_provider(make_settings: MakeSettings) -> None:
    config = resolve(make_settings(), "turn")
    assert config.provider == "local"
    assert config.model == ""


def test_operations_override_field_by_field(make_settings: MakeSettings) -> None:
    settings = make_settings(
        llm_provider="openai",
        llm_model="base-model",
        llm_base_url="http://127.0.0.1:9/v1",
        llm_api_key="shared-key",
        reflect_llm_model="reflect-model",
        turn_llm_provider="scripted",
    )
    reflect = resolve(settings, "reflect")
    assert (reflect.provider, reflect.model, reflect.api_key) == (
        "openai",
        "reflect-model",
        "shared-key",
    )
    assert reflect.base_url == "http://127.0.0.1:9/v1"
    assert resolve(settings, "turn").provider == "scripted"


def test_environment_variables_reach_the_factory(
    monkeypatch: pytest.MonkeyPatch, make_settings: MakeSettings
) -> None:
    monkeypatch.setenv("HEED_LLM_PROVIDER", "scripted")
    monkeypatch.setenv("HEED_TURN_LLM_SCRIPT", json.dumps({"replies": [{"text": "from env"}]}))
    monkeypatch.setenv("HEED_REFLECT_LLM_PROVIDER", "openai")
    monkeypatch.setenv("HEED_REFLECT_LLM_MODEL", "gpt-x")
    settings = make_settings()
    turn = build_provider(settings, "turn")
    assert isinstance(turn, ScriptedProvider)
    assert turn.script.replies[0].text == "from env"
    reflect = build_provider(settings, "reflect")
    assert isinstance(reflect, OpenAIProvider)
    assert reflect.model == "gpt-x"


async def test_scripted_from_settings_answers(make_settings: MakeSettings) -> None:
    settings = make_settings(
        llm_provider="scripted", llm_script=json.dumps([{"text": "scripted hello"}])
    )
    provider = build_provider(settings, "reflect")
    assert (await complete(provider, [ChatMessage.user("hi")])).text == "scripted hello"


def test_unknown_provider_is_400_naming_it(make_settings: MakeSettings) -> None:
    with pytest.raises(UnknownProvider) as caught:
        build_provider(make_settings(turn_llm_provider="gpt5-magic"), "turn")
    assert caught.value.status_code == 400
    assert "'gpt5-magic'" in caught.value.message
    assert "HEED_TURN_LLM_PROVIDER" in caught.value.message


def test_openai_without_model_is_unknown_model(make_settings: MakeSettings) -> None:
    with pytest.raises(UnknownModel, match="HEED_LLM_MODEL"):
        build_provider(make_settings(llm_provider="openai"), "turn")


def test_local_unknown_model_names_it(make_settings: MakeSettings) -> None:
    with pytest.raises(UnknownModel) as caught:
        build_provider(make_settings(llm_model="llama-70b"), "turn")
    assert caught.value.status_code == 400
    assert "'llama-70b'" in caught.value.message


def test_unknown_operation_is_a_programming_error(make_settings: MakeSettings) -> None:
    with pytest.raises(ValueError, match="operation"):
        resolve(make_settings(), "summarize")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "status", "retry_after"),
    [
        (UpstreamRateLimited("openai: slow down", provider="openai", retry_after=7), 503, "7"),
        (UpstreamUnavailable("openai: cannot reach http://x", provider="openai"), 503, None),
        (BadModelOutput("openai: bad JSON", provider="openai"), 502, None),
        (UnknownProvider("unknown LLM provider 'x'"), 400, None),
    ],
)
async def test_provider_errors_become_http_answers(
    error: Exception, status: int, retry_after: str | None
) -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise error

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        response = await client.get("/boom")
    assert response.status_code == status
    assert response.json()["detail"] == str(error)
    assert response.headers.get("retry-after") == retry_after


def test_retain_falls_back_to_the_defaults_field_by_field(make_settings: MakeSettings) -> None:
    settings = make_settings(
        llm_provider="openai",
        llm_model="base-model",
        llm_base_url="http://127.0.0.1:9/v1",
        llm_api_key="shared-key",
        llm_timeout=12.0,
        llm_max_tokens=300,
        retain_llm_model="extractor",
        retain_llm_max_tokens=800,
    )
    retain = resolve(settings, "retain")
    assert (retain.provider, retain.model, retain.base_url, retain.api_key) == (
        "openai",
        "extractor",
        "http://127.0.0.1:9/v1",
        "shared-key",
    )
    assert (retain.timeout, retain.max_tokens) == (12.0, 800)
    assert resolve(settings, "turn").model == "base-model", "retain overrides only retain"
    assert resolve(make_settings(), "retain") == resolve(make_settings(), "turn")


def test_retain_provider_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, make_settings: MakeSettings
) -> None:
    monkeypatch.setenv("HEED_LLM_PROVIDER", "openai")
    monkeypatch.setenv("HEED_LLM_MODEL", "gpt-x")
    monkeypatch.setenv("HEED_RETAIN_LLM_PROVIDER", "scripted")
    monkeypatch.setenv("HEED_RETAIN_LLM_SCRIPT", json.dumps([{"json": {"facts": []}}]))
    monkeypatch.setenv("HEED_RETAIN_LLM_API_KEY", "retain-key")
    settings = make_settings()
    retain = build_provider(settings, "retain")
    assert isinstance(retain, ScriptedProvider)
    assert retain.script.replies[0].json_value == {"facts": []}
    assert resolve(settings, "retain").api_key == "retain-key"
    assert isinstance(build_provider(settings, "reflect"), OpenAIProvider)


def test_unknown_retain_provider_names_its_setting(make_settings: MakeSettings) -> None:
    with pytest.raises(UnknownProvider) as caught:
        build_provider(make_settings(retain_llm_provider="nope"), "retain")
    assert "HEED_RETAIN_LLM_PROVIDER" in caught.value.message
