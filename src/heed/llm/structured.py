"""Structured output: one JSON object from a model, parsed and validated against a schema.

:func:`complete_json` is how heed's own code (fact extraction at retain) gets
data, not prose, from any :class:`~heed.llm.base.ChatProvider`:

1. it runs :func:`~heed.llm.base.complete` with ``json_schema``, so each provider
   asks its model for the schema in its own way (see :mod:`heed.llm.base`);
2. it reads the reply as one JSON object, tolerating what models wrap around it:
   a Markdown fence (```` ```json ... ``` ````), prose before or after (the object
   starting at the first ``{`` is taken, whatever follows it);
3. it validates the object against the schema (Draft 2020-12, ``jsonschema``; a
   registry that refuses every retrieval, so no ``$ref`` reaches the network or
   the disk);
4. on malformed JSON or a schema violation it appends the model's reply and a
   user message naming what was wrong, and asks again, at most *retries* more
   times; then it raises :class:`~heed.llm.base.BadModelOutput` (502) naming the
   problem with a short excerpt of the last reply (never the whole reply), its ``usage``
   the tokens the attempts took.

Each re-ask is reported to the observers (:mod:`heed.llm.observe`) as
``on_retry(provider, None, "invalid_json" | "schema_violation", 0.0)``, and
giving up as ``on_failure`` with the same reason.

Cancellation and provider errors (``UpstreamUnavailable``...) propagate
unchanged and are never retried here (the ``openai`` provider has already
retried transient upstream failures itself).

The schema is heed's own, written in code: validation runs inline, on the
caller's thread, and is fast for replies bounded by ``max_tokens``. A schema
from a caller is untrusted (a ``pattern`` can backtrack catastrophically) and
belongs to :mod:`heed.reflect.schema`, which validates in a killable process.
A schema that is not valid JSON Schema is a programming error (``ValueError``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from jsonschema.exceptions import SchemaError, best_match
from jsonschema.validators import Draft202012Validator
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource

from heed.llm.base import (
    BadModelOutput,
    ChatMessage,
    ChatProvider,
    JsonSchemaFormat,
    ProviderError,
    Usage,
    complete,
)
from heed.llm.observe import notify_failure, notify_retry

__all__ = ["StructuredReply", "complete_json", "index_list", "parse_json_object"]

#: How much of a reply, or of one validation message, an error quotes.
EXCERPT_CHARS: Final = 120
MESSAGE_CHARS: Final = 200
#: Validation errors named in one re-ask (the most relevant first).
MAX_ERRORS_NAMED: Final = 3
#: How much of an unusable reply the re-ask shows the model: enough to see its mistake,
#: not a whole cut-off reply that would fill a small model's context.
ECHO_CHARS: Final = 600

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)

Problem = Literal["invalid_json", "schema_violation"]


@dataclass(frozen=True, slots=True)
class StructuredReply:
    """What :func:`complete_json` returns.

    ``value`` is the validated object; ``attempts`` the number of model calls it
    took (1 when the first reply was good); ``usage`` the tokens of all of them.
    """

    value: dict[str, Any]
    attempts: int
    usage: Usage


class _Unusable(Exception):
    """A reply that is not a valid object of the schema (internal to this module)."""

    def __init__(self, problem: Problem, message: str) -> None:
        super().__init__(message)
        self.problem = problem
        self.message = message


def index_list(most: int) -> dict[str, Any]:
    """The JSON schema of a list of at most *most* indexes (non-negative integers): how a
    reply names the numbered items of its prompt (units, facts, observations)."""
    return {"type": "array", "maxItems": most, "items": {"type": "integer", "minimum": 0}}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _decode_error(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg} at line {exc.lineno} column {exc.colno}"


def parse_json_object(text: str) -> dict[str, Any]:
    """The JSON object in a model's *text*: the whole text, a fenced block, or the
    object starting at the first ``{`` (text after it is ignored).

    Raises :class:`ValueError` naming what is wrong (no object, malformed JSON, a
    JSON value that is not an object).
    """
    try:
        return _parse_object(text)
    except _Unusable as exc:
        raise ValueError(exc.message) from None


def _parse_object(text: str) -> dict[str, Any]:
    stripped = text.strip()
    if not stripped:
        raise _Unusable("invalid_json", "the reply is empty, not a JSON object")
    try:
        value = json.loads(stripped)
    except json.JSONDecodeError:
        pass
    else:
        if isinstance(value, dict):
            return value
        raise _Unusable(
            "invalid_json", f"the reply is a JSON {type(value).__name__}, not a JSON object"
        )
    fence = _FENCE.search(stripped)
    if fence is not None and fence.group(1).strip().startswith("{"):
        stripped = fence.group(1).strip()
    start = stripped.find("{")
    if start < 0:
        raise _Unusable("invalid_json", "the reply holds no JSON object (no '{')")
    try:
        value, _end = json.JSONDecoder().raw_decode(stripped, start)
    except json.JSONDecodeError as exc:
        problem = f"the reply is not valid JSON: {_decode_error(exc)}"
        raise _Unusable("invalid_json", problem) from None
    if not isinstance(value, dict):  # pragma: no cover - a '{' always starts an object
        raise _Unusable("invalid_json", "the reply holds no JSON object")
    return value


def _retrieve_nothing(uri: str) -> Resource[Any]:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


_NO_RETRIEVAL: Final[Registry[Any]] = Registry(retrieve=_retrieve_nothing)  # type: ignore[call-arg]


@functools.lru_cache(maxsize=64)
def _validator(schema_json: str) -> Draft202012Validator:
    schema = json.loads(schema_json)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ValueError(f"not a valid JSON Schema (Draft 2020-12): {exc.message}") from None
    return Draft202012Validator(schema, registry=_NO_RETRIEVAL)


def _check(value: dict[str, Any], schema: JsonSchemaFormat) -> None:
    validator = _validator(json.dumps(schema.schema, sort_keys=True))
    errors = list(validator.iter_errors(value))
    if not errors:
        return
    first = best_match(errors)
    ordered = [first, *(e for e in errors if e is not first)][:MAX_ERRORS_NAMED]
    named = "; ".join(f"at {e.json_path}: {_clip(e.message, MESSAGE_CHARS)}" for e in ordered)
    more = f" (and {len(errors) - len(ordered)} more)" if len(errors) > len(ordered) else ""
    raise _Unusable(
        "schema_violation", f"the JSON does not match the {schema.name} schema: {named}{more}"
    )


def _ask_again(problem: str, schema: JsonSchemaFormat) -> ChatMessage:
    return ChatMessage.user(
        f"Your reply cannot be used: {problem}. Reply again with only one JSON object that "
        f"matches the {schema.name} schema, and no other text."
    )


async def complete_json(
    provider: ChatProvider,
    messages: Sequence[ChatMessage],
    schema: JsonSchemaFormat,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    retries: int = 1,
) -> StructuredReply:
    """Ask *provider* for one JSON object matching *schema*; see the module docstring.

    Returns a :class:`StructuredReply` (the object, the attempts it took, the
    tokens spent). At most ``1 + retries`` model calls are made; when none gives
    a valid object, raises :class:`BadModelOutput` (502) naming the last problem
    and quoting the start of the last reply; so does a re-ask the provider refuses
    as a bad request (400: the conversation no longer fits the model's context).
    Cancellation and other provider errors propagate unchanged. *messages* is not
    modified.
    """
    if retries < 0:
        raise ValueError("retries must be >= 0")
    _validator(json.dumps(schema.schema, sort_keys=True))  # a bad schema fails before any call
    conversation = list(messages)
    prompt_tokens = completion_tokens = 0
    attempts = 0
    while True:
        attempts += 1
        try:
            reply = await complete(
                provider,
                conversation,
                max_tokens=max_tokens,
                temperature=temperature,
                json_schema=schema,
            )
        except ProviderError as exc:
            if attempts == 1 or exc.status_code != 400:
                raise
            notify_failure(provider.name, None, "refused", detail=str(exc))
            refused = BadModelOutput(
                f"{provider.name}: no usable {schema.name} JSON from the model: the re-ask "
                f"was refused ({exc})",
                provider=provider.name,
            )
            refused.usage = Usage(prompt_tokens, completion_tokens)
            raise refused from exc
        prompt_tokens += reply.usage.prompt_tokens
        completion_tokens += reply.usage.completion_tokens
        try:
            value = _parse_object(reply.text)
            _check(value, schema)
        except _Unusable as exc:
            problem = exc.message
            if reply.finish_reason == "length":
                problem += " (the reply was cut off at the token limit)"
            if attempts > retries:
                notify_failure(provider.name, None, exc.problem, detail=problem)
                excerpt = _clip(reply.text.strip(), EXCERPT_CHARS)
                unusable = BadModelOutput(
                    f"{provider.name}: no usable {schema.name} JSON from the model after "
                    f"{attempts} attempt{'s' if attempts > 1 else ''}: {problem}; "
                    f"the reply began {excerpt!r}",
                    provider=provider.name,
                )
                unusable.usage = Usage(prompt_tokens, completion_tokens)
                raise unusable from None
            notify_retry(provider.name, None, exc.problem, 0.0, detail=problem)
            echo = _clip(reply.text, ECHO_CHARS)
            conversation += [ChatMessage.assistant(echo), _ask_again(problem, schema)]
            continue
        return StructuredReply(
            value=value,
            attempts=attempts,
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
        )
