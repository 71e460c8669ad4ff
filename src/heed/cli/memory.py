"""Memory commands of the ``heed`` CLI: retain, recall, import-locomo.

They talk to a running server over HTTP: ``--url``, by default the server that
:class:`~heed.settings.Settings` describes (``http://HEED_HOST:HEED_PORT``), with
``--api-key`` (``HEED_API_KEY``, the client's key; ``HEED_API_KEYS`` is the server's
list) as a bearer key when the server has keys configured. Bulk retains are sent in
batches with a progress bar.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click
import httpx

from heed.settings import Settings

__all__ = ["import_locomo", "recall", "retain"]


def _default_url() -> str:
    settings = Settings()
    host = settings.host
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"  # a wildcard bind is reached on loopback
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


def _bank_path(bank: str, *rest: str) -> str:
    """``/v1/default/banks/{bank}/...`` with *bank* quoted as one path segment, so a bank
    id holding ``/``, ``?`` or ``..`` names that bank and nothing else."""
    return "/".join(["/v1/default/banks", quote(bank, safe=""), *rest])


def _client(url: str | None, api_key: str | None, timeout: float = 600.0) -> httpx.Client:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=url or _default_url(), headers=headers, timeout=timeout)


def _check(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise click.ClickException(f"{response.status_code}: {detail}")
    body: dict[str, Any] = response.json()
    return body


def _connection_options(fn: Any) -> Any:
    fn = click.option(
        "--url", default=None, help="Server URL (default http://HEED_HOST:HEED_PORT)."
    )(fn)
    fn = click.option(
        "--api-key", envvar="HEED_API_KEY", default=None, help="Bearer key (HEED_API_KEY)."
    )(fn)
    return click.option("--bank", "-b", default="default", show_default=True, help="Bank id.")(fn)


def _items_of(text: str, name: str) -> list[dict[str, Any]]:
    """Items from a JSON list / {"items": [...]} / JSON lines, else the whole text as one item."""
    stripped = text.strip()
    if not stripped:
        raise click.ClickException(f"{name} is empty")
    try:
        data = json.loads(stripped)
    except ValueError:
        data = None
        lines = [line for line in stripped.splitlines() if line.strip()]
        try:
            rows = [json.loads(line) for line in lines]
        except ValueError:
            rows = []
        if rows and all(isinstance(r, dict) and "content" in r for r in rows):
            return rows
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        data = data["items"]
    if isinstance(data, list) and all(isinstance(r, dict) and "content" in r for r in data):
        return data
    return [{"content": text}]


def _batches(items: list[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@click.command()
@click.argument("source", type=click.File("r", encoding="utf-8"))
@_connection_options
@click.option("--document-id", default=None, help="Document id for items without one.")
@click.option("--context", default=None, help="Context for items without one.")
@click.option("--tag", "tags", multiple=True, help="Tag the retained items (repeatable).")
@click.option("--batch-size", default=100, show_default=True, help="Items per request.")
@click.option("--async", "run_async", is_flag=True, help="Queue as operations; print their ids.")
def retain(
    source: Any,
    bank: str,
    api_key: str | None,
    url: str | None,
    document_id: str | None,
    context: str | None,
    tags: tuple[str, ...],
    batch_size: int,
    run_async: bool,
) -> None:
    """Retain SOURCE (a file, or - for stdin) into a bank.

    SOURCE is plain text (one item), a JSON list of items (or {"items": [...]}),
    or JSON lines, each item like {"content": ..., "timestamp": ..., ...}.
    """
    items = _items_of(source.read(), getattr(source, "name", "input"))
    for item in items:
        if document_id and "document_id" not in item:
            item["document_id"] = document_id
        if context and "context" not in item:
            item["context"] = context
        if tags:
            item["tags"] = list(dict.fromkeys([*item.get("tags", []), *tags]))
    with _client(url, api_key) as http:
        _check(http.put(_bank_path(bank), json={}))
        units = 0
        operations: list[str] = []
        with click.progressbar(
            length=len(items), label=f"retain into {bank}", file=sys.stderr
        ) as bar:
            for batch in _batches(items, batch_size):
                body = _check(
                    http.post(
                        _bank_path(bank, "memories"),
                        json={"items": batch, "async": run_async},
                    )
                )
                units += int(body.get("units_count") or 0)
                operations.extend(body.get("operation_ids") or [])
                bar.update(len(batch))
    if run_async:
        click.echo("\n".join(operations))
    else:
        click.echo(f"retained {len(items)} items as {units} memory units into {bank}")


@click.command()
@click.argument("query")
@_connection_options
@click.option(
    "--budget", type=click.Choice(["low", "mid", "high"]), default="mid", show_default=True
)
@click.option("--max-tokens", default=4096, show_default=True, help="Token budget of the results.")
@click.option("--limit", "-n", default=10, show_default=True, help="Results to print.")
@click.option("--trace", is_flag=True, help="Print per-stage timings.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON response.")
def recall(
    query: str,
    bank: str,
    api_key: str | None,
    url: str | None,
    budget: str,
    max_tokens: int,
    limit: int,
    trace: bool,
    as_json: bool,
) -> None:
    """Recall memories of a bank for QUERY."""
    with _client(url, api_key, timeout=120) as http:
        body = _check(
            http.post(
                _bank_path(bank, "memories", "recall"),
                json={"query": query, "budget": budget, "max_tokens": max_tokens, "trace": trace},
            )
        )
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    for result in body["results"][:limit]:
        score = (result.get("scores") or {}).get("final", 0.0)
        when = (result.get("occurred_start") or "")[:10]
        click.echo(f"{score:6.3f}  {when:10}  {result['text']}")
    if not body["results"]:
        click.echo("no memories found")
    if trace and body.get("trace"):
        stages = ", ".join(f"{s['stage']} {s['ms']:.1f} ms" for s in body["trace"]["stages"])
        click.echo(f"trace: {stages} (total {body['trace']['total_ms']:.1f} ms)", err=True)


_LOCOMO_DATE = re.compile(r"\s*(\d+):(\d+)\s*(am|pm)\s+on\s+(\d+)\s+(\w+),?\s+(\d{4})", re.I)


def _locomo_date(raw: str) -> str:
    m = _LOCOMO_DATE.match(raw)
    if not m:
        raise click.ClickException(f"unrecognized LoCoMo session date {raw!r}")
    hour, minute, ampm, day, month, year = m.groups()
    parsed = datetime.strptime(f"{day} {month} {year}", "%d %B %Y")
    hour_24 = int(hour) % 12 + (12 if ampm.lower() == "pm" else 0)
    return parsed.replace(hour=hour_24, minute=int(minute), tzinfo=UTC).isoformat()


@click.command("import-locomo")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--url", default=None, help="Server URL (default http://HEED_HOST:HEED_PORT).")
@click.option("--api-key", envvar="HEED_API_KEY", default=None, help="Bearer key (HEED_API_KEY).")
@click.option("--prefix", default="locomo-", show_default=True, help="Bank id prefix.")
def import_locomo(path: Path, url: str | None, api_key: str | None, prefix: str) -> None:
    """Import a LoCoMo file: one bank per conversation, one document per session.

    Each turn becomes an item with the session date as timestamp and its
    dia_id in metadata; a progress bar counts turns.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    plan: list[tuple[str, dict[int, list[dict[str, Any]]]]] = []
    for sample in data:
        conv = sample["conversation"]
        sessions: dict[int, list[dict[str, Any]]] = defaultdict(list)
        n = 1
        while f"session_{n}" in conv:
            when = _locomo_date(conv[f"session_{n}_date_time"])
            for turn in conv[f"session_{n}"]:
                text = turn["text"]
                if turn.get("blip_caption"):
                    text = f"{text} [shares a photo: {turn['blip_caption']}]"
                sessions[n].append(
                    {
                        "content": f"{turn['speaker']}: {text}",
                        "timestamp": when,
                        "metadata": {"dia_id": turn["dia_id"]},
                        "document_id": f"session-{n}",
                    }
                )
            n += 1
        plan.append((prefix + str(sample.get("sample_id", len(plan))), sessions))
    total = sum(len(items) for _, sessions in plan for items in sessions.values())
    with (
        _client(url, api_key) as http,
        click.progressbar(
            length=total, label="import LoCoMo", file=sys.stderr, show_pos=True
        ) as bar,
    ):
        for bank, sessions in plan:
            _check(http.put(_bank_path(bank), json={"name": bank}))
            for items in sessions.values():
                _check(http.post(_bank_path(bank, "memories"), json={"items": items}))
                bar.update(len(items))
    click.echo(f"imported {total} turns into {len(plan)} banks ({prefix}*)")
