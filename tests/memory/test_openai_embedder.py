"""The OpenAI-compatible embeddings client against a fake endpoint on loopback."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi import FastAPI

from heed.memory.embeddings import OpenAIEmbedder
from heed.runtime import CancellationToken, OperationCancelled, RequestContext, use_context
from tests.support import live_server


def _fake_upstream() -> tuple[FastAPI, list[list[str]]]:
    app = FastAPI()
    seen: list[list[str]] = []

    @app.post("/v1/embeddings")
    async def embeddings(body: dict[str, object]) -> dict[str, object]:
        texts = list(body["input"])  # type: ignore[call-overload]
        seen.append(texts)
        data = [
            {"index": i, "embedding": [float(len(t)), 1.0, 0.0, 0.0]}
            for i, t in reversed(list(enumerate(texts)))
        ]
        return {"data": data, "model": body["model"]}

    return app, seen


def test_batches_orders_and_normalizes() -> None:
    app, seen = _fake_upstream()
    with live_server(app) as server:
        embedder = OpenAIEmbedder(f"{server.url}/v1", "fake", dim=4, batch_size=2)
        vectors = embedder.embed(["a", "bbb", "cc"])
    assert [len(batch) for batch in seen] == [2, 1]
    assert vectors.shape == (3, 4)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    assert vectors[1][0] > vectors[2][0] > vectors[0][0]  # order kept despite reversed data


def test_checks_the_token_between_requests() -> None:
    app, seen = _fake_upstream()
    token = CancellationToken()
    token.cancel("client disconnected")
    with live_server(app) as server:
        embedder = OpenAIEmbedder(f"{server.url}/v1", "fake", dim=4)
        with use_context(RequestContext(token=token)), pytest.raises(OperationCancelled):
            embedder.embed(["a"])
    assert seen == []


def test_wrong_dimension_is_named() -> None:
    app, _ = _fake_upstream()
    with live_server(app) as server:
        embedder = OpenAIEmbedder(f"{server.url}/v1", "fake", dim=8)
        with pytest.raises(ValueError, match="4-dimensional"):
            embedder.embed(["a"])
