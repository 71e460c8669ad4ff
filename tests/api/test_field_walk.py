"""Every field of every request model of the unmodified Hindsight client is honoured by heed
or refused by name.

The walk: each public method of every API class in ``hindsight_client_api.api`` whose
parameters include a request model (a pydantic model of ``hindsight_client_api.models``)
gives the route it calls (its ``_*_serialize`` method, recorded as in
``test_route_walk.py``) and the model's properties. heed's side is its OpenAPI document:
the properties of the JSON body each route takes.

A property heed's body for that route names is honoured, or refused by name by the route
(heed's models list the fields they refuse, e.g. a mental model trigger's crons). A
property it does not name must be refused by name on a real server: a request setting it
(to a sample value of its type, beside the model's required fields) answers 4xx with the
property's name in the body. Routes heed does not serve (501 or not yet served,
:mod:`heed.api.unserved`) are left out: every field of theirs is refused with the route.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import tempfile
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

import hindsight_client_api.api as client_api
import httpx
import pytest
from pydantic import BaseModel

from heed.api.app import create_app
from heed.api.unserved import NOT_IMPLEMENTED, NOT_YET_SERVED, normalise
from heed.settings import Settings
from tests.api.test_route_walk import Key, _Recorder
from tests.support import LiveServer, live_server


@dataclass(frozen=True, slots=True)
class ClientBody:
    """A client method's route and the request model it sends."""

    method: str
    path: str
    model: type[BaseModel]

    @property
    def key(self) -> Key:
        return self.method, normalise(self.path)


def client_bodies() -> list[ClientBody]:
    """Every (route, request model) the client sends, sorted by path then method."""
    found: dict[Key, ClientBody] = {}
    for info in pkgutil.iter_modules(client_api.__path__):
        module = importlib.import_module(f"{client_api.__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            for name, function in inspect.getmembers(cls, inspect.isfunction):
                if name.startswith("_") or name.endswith(
                    ("_with_http_info", "_without_preload_content")
                ):
                    continue
                hints = typing.get_type_hints(function)
                models = [
                    hint
                    for param, hint in hints.items()
                    if param != "return" and inspect.isclass(hint) and issubclass(hint, BaseModel)
                ]
                if not models:
                    continue
                recorder = _Recorder()
                api = cls.__new__(cls)
                api.api_client = recorder
                serializer = getattr(cls, f"_{name}_serialize")
                params = list(inspect.signature(serializer).parameters)[1:]
                serializer(api, **{**dict.fromkeys(params), "_host_index": 0})
                method, path = recorder.requests[0]
                body = ClientBody(method, path, models[0])
                found[body.key] = body
    return sorted(found.values(), key=lambda b: (b.path, b.method))


Schema = dict[str, Any]


def heed_bodies() -> dict[Key, list[Schema]]:
    """The JSON body schemas (objects, references resolved) of each heed route."""
    with tempfile.TemporaryDirectory() as data_dir:
        spec = create_app(Settings(data_dir=Path(data_dir))).openapi()
    schemas = spec["components"]["schemas"]
    bodies: dict[Key, list[Schema]] = {}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            for media in content.values():
                bodies[(method.upper(), normalise(path))] = objects(media["schema"], schemas)
    return bodies


def objects(schema: Schema, schemas: dict[str, Schema]) -> list[Schema]:
    """The object schemas *schema* allows: itself, an array's items, an ``anyOf``'s parts."""
    while "$ref" in schema:
        schema = schemas[schema["$ref"].rsplit("/", 1)[-1]]
    out = [schema] if "properties" in schema else []
    if schema.get("type") == "array" and "items" in schema:
        out += objects(schema["items"], schemas)
    for part in schema.get("anyOf", ()):
        out += objects(part, schemas)
    for found in out:
        found.setdefault("_schemas", schemas)
    return out


def client_models(annotation: Any) -> list[type[BaseModel]]:
    """The client models an annotation holds (directly, in a list, in a union)."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in client_models(arg)]


#: A field by its path from the body: (field name, the model holding it) per level.
FieldPath = tuple[tuple[str, type[BaseModel]], ...]


def unnamed_fields(
    client: list[ClientBody], heed: dict[Key, list[Schema]]
) -> list[tuple[ClientBody, FieldPath]]:
    """The client's properties, nested ones too, that heed's body schema for the route
    does not name (served routes only)."""
    unserved = {r.key for r in (*NOT_IMPLEMENTED, *NOT_YET_SERVED)}
    out: list[tuple[ClientBody, FieldPath]] = []

    def walk(model: type[BaseModel], found: list[Schema], path: FieldPath) -> None:
        named: dict[str, list[Schema]] = {}
        for schema in found:
            for name, sub in schema["properties"].items():
                named.setdefault(name, []).extend(objects(sub, schema["_schemas"]))
        for key, field in model.model_fields.items():
            name = field.alias or key
            here = (*path, (name, model))
            if name not in named:
                out.append((body, here))
                continue
            for nested in client_models(field.annotation):
                if named[name]:
                    walk(nested, named[name], here)

    for body in client:
        if body.key not in unserved:
            walk(body.model, heed.get(body.key, []), ())
    return out


@pytest.fixture(scope="module")
def walked() -> tuple[list[ClientBody], dict[Key, set[str]]]:
    return client_bodies(), heed_bodies()


def test_the_walk_finds_the_clients_request_models(
    walked: tuple[list[ClientBody], dict[Key, set[str]]],
) -> None:
    client, heed = walked
    by_key = {b.key: b.model.__name__ for b in client}
    assert by_key[("POST", "/v1/default/banks/{}/memories/recall")] == "RecallRequest"
    assert by_key[("PATCH", "/v1/default/banks/{}/memories/{}")] == "UpdateMemoryRequest"
    assert len(client) == 25  # hindsight-client 1.1.0: 25 routes send a request model
    [recall] = heed[("POST", "/v1/default/banks/{}/memories/recall")]
    assert "query" in recall["properties"]


def test_a_field_heed_does_not_name_is_caught(
    walked: tuple[list[ClientBody], dict[Key, set[str]]],
) -> None:
    """The walk can fail: drop a property of heed's retain items and it is listed, by path."""
    client, heed = walked
    assert not [b for b, _ in unnamed_fields(client, heed) if b.path.endswith("/memories")]
    key = ("POST", "/v1/default/banks/{}/memories")
    [retain] = heed[key]
    items = dict(retain["properties"]["items"])
    [item] = objects(items, retain["_schemas"])
    broken_item = {
        **item,
        "properties": {k: v for k, v in item["properties"].items() if k != "context"},
    }
    broken_retain = {
        **retain,
        "properties": {**retain["properties"], "items": {"type": "array", "items": broken_item}},
    }
    found = unnamed_fields(client, {**heed, key: [broken_retain]})
    assert [tuple(name for name, _ in path) for b, path in found if b.key == key] == [
        ("items", "context")
    ]


# -- what heed's bodies do not name, refused by name on a real server --------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("fields"), llm_provider="scripted")
    with live_server(create_app(settings)) as srv:
        yield srv


def sample(annotation: Any) -> Any:
    """A non-null value of a client model field's type."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is typing.Union or str(origin) == "types.UnionType":
        return sample(next(a for a in args if a is not type(None)))
    if origin is typing.Annotated:
        return sample(args[0])
    if origin in (list, tuple, set):
        return [sample(args[0])] if args else ["x"]
    if origin is dict:
        return {"x": "y"}
    if annotation is bool:
        return True
    if annotation is int:
        return 1000
    if annotation is float:
        return 0.5
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return {}
    return "x"


def required(model: type[BaseModel]) -> dict[str, Any]:
    """Samples of the model's required fields."""
    return {
        (field.alias or key): sample(field.annotation)
        for key, field in model.model_fields.items()
        if field.is_required()
    }


def request_body(path: FieldPath) -> dict[str, Any]:
    """A body setting the field at *path* to a sample, beside each level's required fields
    (a list-typed level holds one element)."""
    (name, model), *rest = path
    body = required(model)
    field = next(f for k, f in model.model_fields.items() if (f.alias or k) == name)
    if not rest:
        body[name] = sample(field.annotation)
        return body
    inner = request_body(tuple(rest))
    listed = get_origin(field.annotation) is list or any(
        get_origin(a) is list for a in get_args(field.annotation)
    )
    body[name] = [inner] if listed else inner
    return body


def test_every_field_heed_does_not_name_is_refused_by_name(
    walked: tuple[list[ClientBody], dict[Key, set[str]]], server: LiveServer
) -> None:
    client, heed = walked
    fields = unnamed_fields(client, heed)
    accepted: list[str] = []
    for body, field_path in fields:
        name = field_path[-1][0]
        path = body.path.replace("{bank_id}", "field-walk")
        for param in ("{memory_id}", "{document_id}", "{mental_model_id}", "{directive_id}"):
            path = path.replace(param, "x")
        httpx.put(f"{server.url}/v1/default/banks/field-walk", json={}, timeout=30)
        response = httpx.request(
            body.method,
            server.url + path,
            json=request_body(field_path),
            timeout=30,
        )
        if not (400 <= response.status_code < 500 and name in response.text):
            accepted.append(
                f"{body.method} {body.path} {'.'.join(n for n, _ in field_path)}: "
                f"{response.status_code} {response.text[:120]}"
            )
    assert not accepted, "fields neither honoured nor refused by name:\n" + "\n".join(accepted)
