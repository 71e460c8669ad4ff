"""``response_schema``: the policy for a caller's JSON Schema, and structured output.

A ``response_schema`` comes from whoever may call reflect, so it is untrusted
input. The policy, checked before any work starts (:func:`check_schema`; run it
off the event loop, the route does so with :func:`heed.runtime.run_in_thread`):

- it is a JSON object of at most :data:`MAX_SCHEMA_BYTES` bytes, nested at most
  :data:`MAX_SCHEMA_DEPTH` levels, with at most :data:`MAX_SCHEMA_NODES` values;
- every ``$ref`` / ``$dynamicRef`` / ``$recursiveRef`` is a JSON pointer into the
  schema itself (``#`` or ``#/...``): nothing is ever fetched, no URL, no file;
  ``$id`` is allowed only at the root, so a pointer means what it says;
- no ``$ref`` may lead back to itself without descending into the instance
  (``{"$ref": "#"}``), which would make validation recurse forever;
- it is valid JSON Schema for its ``$schema`` dialect (default: the latest).

A schema that breaks the policy is the caller's mistake:
:class:`InvalidResponseSchema` (400) names the problem. Validation of the model's
JSON uses a registry that refuses every retrieval, so even a reference the
policy missed could not reach the network or the disk.

After the answer, one more model call turns it into JSON; the JSON is validated
against the schema. A model that cannot produce valid JSON is not an error of
the request: the answer text stands and ``structured_output_error`` says why.

That validation runs in a child process (:func:`heed.runtime.run_in_process`), killed
after :data:`VALIDATION_SECONDS` or when the reflect is cancelled. A ``pattern`` in the
caller's schema can backtrack catastrophically on a crafted answer (``^(a+)+$`` against
``"aaaa…b"``), and Python's regular expressions hold the GIL while they match: in a
thread that would freeze the whole server, and no token can stop it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Final, NoReturn

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource, Unresolvable

from heed.errors import HeedError
from heed.llm.base import ChatMessage, Completion, ToolSpec
from heed.runtime import WorkerProcessDied, run_in_process

__all__ = [
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "MAX_SCHEMA_NODES",
    "VALIDATION_SECONDS",
    "InvalidResponseSchema",
    "check_schema",
    "structured_output",
]

MAX_SCHEMA_BYTES: Final = 32 * 1024
MAX_SCHEMA_DEPTH: Final = 32
MAX_SCHEMA_NODES: Final = 2_000
MAX_PATTERN_CHARS: Final = 1_000
#: How long validating the model's JSON against the caller's schema may take.
VALIDATION_SECONDS: Final = 2.0

_REF_KEYS: Final = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords whose subschemas apply to the same instance location (no descent): a
# cycle through only these never terminates.
_IN_PLACE_ONE: Final = ("not", "if", "then", "else")
_IN_PLACE_MANY: Final = ("allOf", "anyOf", "oneOf")

ModelCall = Callable[
    [Sequence[ChatMessage], Sequence[ToolSpec] | None, str, int], Awaitable[Completion]
]


class InvalidResponseSchema(HeedError):
    """``response_schema`` breaks the schema policy or is not valid JSON Schema (400)."""

    status_code = 400


def _refuse(message: str) -> NoReturn:
    raise InvalidResponseSchema(f"response_schema: {message}")


def _retrieve_nothing(uri: str) -> Resource[Any]:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


_NO_RETRIEVAL: Final[Registry[Any]] = Registry(retrieve=_retrieve_nothing)  # type: ignore[call-arg]


def _walk(schema: dict[str, Any]) -> Iterator[tuple[str, Any, int]]:
    """Every value under *schema* as ``(path, value, depth)``, without recursion."""
    stack: list[tuple[str, Any, int]] = [("", schema, 1)]
    while stack:
        path, value, depth = stack.pop()
        yield path, value, depth
        if isinstance(value, dict):
            stack.extend((f"{path}/{k}", v, depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}/{i}", v, depth + 1) for i, v in enumerate(value))


def _pointer_target(root: dict[str, Any], ref: str, where: str) -> Any:
    """The value a local ``#/...`` pointer names (RFC 6901), or a refusal."""
    target: Any = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            _refuse(f"$ref {ref!r} at {where or '(root)'} points at nothing in the schema")
    return target


def _in_place(node: dict[str, Any], root: dict[str, Any]) -> Iterator[Any]:
    """Subschemas evaluated at the same instance location as *node*."""
    for key in _REF_KEYS:
        ref = node.get(key)
        if isinstance(ref, str):
            yield _pointer_target(root, ref, "")
    for key in _IN_PLACE_ONE:
        if isinstance(node.get(key), dict):
            yield node[key]
    for key in _IN_PLACE_MANY:
        if isinstance(node.get(key), list):
            yield from node[key]


def _refuse_ref_cycles(root: dict[str, Any], ref_nodes: list[dict[str, Any]]) -> None:
    """Refuse a ``$ref`` that can reach itself through in-place keywords only."""
    for start in ref_nodes:
        seen: set[int] = set()
        stack = list(_in_place(start, root))
        while stack:
            node = stack.pop()
            if node is start:
                _refuse("a $ref refers back to itself without descending (infinite recursion)")
            if isinstance(node, dict) and id(node) not in seen:
                seen.add(id(node))
                stack.extend(_in_place(node, root))


def _check_patterns(node: dict[str, Any], path: str) -> None:
    """Refuse a ``pattern`` (or ``patternProperties`` key) that is too long or that Python
    cannot compile: deeply nested groups exhaust the regex parser's recursion, which is
    not the JSON nesting the depth limit counts."""
    where = path or "(root)"
    candidates = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
    if isinstance(node.get("patternProperties"), dict):
        candidates.extend(node["patternProperties"])
    for pattern in candidates:
        if len(pattern) > MAX_PATTERN_CHARS:
            _refuse(f"a pattern at {where} is longer than {MAX_PATTERN_CHARS} characters")
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            _refuse(f"the pattern at {where} is not a usable regular expression: {reason}")


def _check_policy(schema: dict[str, Any]) -> None:
    ref_nodes: list[dict[str, Any]] = []
    for count, (path, value, depth) in enumerate(_walk(schema), start=1):
        if count > MAX_SCHEMA_NODES:
            _refuse(f"more than {MAX_SCHEMA_NODES} values; simplify the schema")
        if depth > MAX_SCHEMA_DEPTH:
            _refuse(f"nested deeper than {MAX_SCHEMA_DEPTH} levels (at {path})")
        if not isinstance(value, dict):
            continue
        _check_patterns(value, path)
        if path and any(isinstance(value.get(key), str) for key in ("$id", "id")):
            _refuse(f"$id is allowed only at the root (found at {path})")
        for key in _REF_KEYS:
            if key not in value:
                continue
            ref = value[key]
            if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
                _refuse(
                    f"{key} at {path or '(root)'} must point into the schema itself "
                    f"('#' or '#/...'); remote, file and anchor references are refused"
                )
            _pointer_target(schema, ref, path)
            ref_nodes.append(value)
    size = len(json.dumps(schema, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > MAX_SCHEMA_BYTES:
        _refuse(f"{size} bytes is more than the limit of {MAX_SCHEMA_BYTES}")
    _refuse_ref_cycles(schema, ref_nodes)


def check_schema(schema: Any) -> None:
    """Raise :class:`InvalidResponseSchema` unless *schema* passes the policy above.

    Pure CPU, bounded by the policy's limits; call it off the event loop.
    """
    if not isinstance(schema, dict):
        _refuse("must be a JSON object (a JSON Schema)")
    _check_policy(schema)
    try:
        validator_for(schema).check_schema(schema)
    except RecursionError:
        _refuse("nested too deeply to check")
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        _refuse(f"not valid JSON Schema at {where}: {exc.message}")


def _validate(value: Any, schema: dict[str, Any]) -> str | None:
    """Why *value* does not match *schema*, or None. Never retrieves a reference."""
    validator = validator_for(schema)(schema, registry=_NO_RETRIEVAL)
    try:
        error = next(iter(validator.iter_errors(value)), None)
    except (Unresolvable, RecursionError) as exc:
        return f"response_schema could not be applied: {type(exc).__name__}"
    return None if error is None else error.message


def _first_json_object(text: str) -> Any:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("the model's reply contains no JSON object")
    return json.loads(text[start : end + 1])


async def structured_output(
    call: ModelCall, answer: str, schema: dict[str, Any]
) -> tuple[dict[str, Any] | None, str | None]:
    """``(value, None)`` with JSON matching *schema*, or ``(None, why not)``."""
    messages = [
        ChatMessage.system(
            "Convert the answer into JSON matching the JSON Schema. Reply with only the JSON."
        ),
        ChatMessage.user(f"JSON Schema:\n{json.dumps(schema)}\n\nAnswer:\n{answer}"),
    ]
    completion = await call(messages, None, "structured_output", 0)
    try:
        value = _first_json_object(completion.text)
    except (ValueError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
        return None, f"the model did not produce JSON: {exc}"
    try:
        async with asyncio.timeout(VALIDATION_SECONDS):
            mismatch = await run_in_process(_validate, value, schema)
    except TimeoutError:
        return None, (
            f"validating the model's JSON against response_schema took longer than "
            f"{VALIDATION_SECONDS:g} s (a pattern that backtracks?) and was stopped"
        )
    except WorkerProcessDied as exc:
        return None, f"validating the model's JSON against response_schema failed: {exc}"
    if mismatch is not None:
        return None, f"the model's JSON does not match response_schema: {mismatch}"
    if not isinstance(value, dict):
        return None, "the model's JSON is not an object"
    return value, None
