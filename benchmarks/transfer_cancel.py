"""Bank transfer: how fast an import, a clone and an export stop when cancelled while they
process, what they cost in time, and how much memory a whole bank's transfer takes.

A real ``heed serve`` (SQLite, or PostgreSQL with ``--postgres``) and synthetic archives of
memories (documents of 400 dialogue turns, an entity per speaker, temporal links; random
unit vectors of the default embedder's size, so nothing is embedded), made with heed's own
archive writer. Measured, in this order:

1. **cancel while processing**, ``--trials`` times for each of ``--kinds`` (import, clone,
   export of a bank of ``--cancel-units`` memories, and a merge of that archive into a new
   empty bank): the operation is submitted, and once its progress
   shows it processing (some rows done, not all) and a random 0-200 ms more,
   ``POST /v1/runs/{id}/cancel`` is sent; the latency is the run's ``finished_at``
   (stamped when its worker has unwound and its lane slot is free) minus the wall time the
   cancel was sent, as ``consolidation_contention.py``'s ``_cancel_trials``; after each,
   the target bank must not exist (an operation that ended before the cancel is no trial;
   a merge's bank exists, with whole documents only, and is deleted);
2. **bank delete while processing**, ``--delete-trials`` imports stopped by deleting the
   bank the operation belongs to: the delete's answer time and the run's stop;
3. **whole transfers**, last (their large writes and deletes would leave PostgreSQL
   vacuuming beside the cancels): an archive of ``--units`` memories imported as a bank,
   that bank exported and cloned (none with ``--units 0``), each timed, with the server's
   RSS sampled every 50 ms (a transfer holds a page of rows, never the bank; a clone runs
   the export and the import code on a temporary archive); the import's upload is
   spooled to disk by the server, and its RSS is shown before and after the upload too.
   On PostgreSQL a ``VACUUM ANALYZE`` runs first (timed apart): the trials' cancelled
   imports leave dead rows whose autovacuum (an HNSW index's vacuum repairs its graph)
   would otherwise share the CPUs with the whole transfers, by chance.

The machine's 1-minute load average is recorded at the start of each part: on a shared
machine the other processes' load moves every figure (``machine.load_average_1m`` is the
load at the end).

At the end no staging bank may be left (they are deleted in the background after a cancel;
SQLite checked). Target (issue 31): cancel p99 <= 50 ms. Writes
``benchmarks/results/transfer_cancel.json`` (``_postgres`` with ``--postgres``).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import os
import random
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg

from _cluster import postgres
from _runs import get_run as _run
from _runs import latency_summary as _summary
from _runs import until as _until
from _server import Server, serve, write_result
from _synthetic import DIM, MODEL, NOW, SPEAKERS, turn
from heed.memory.models import Bank
from heed.storage.transfer.pg_parallel import PG_WRITERS
from heed.transfer.archive import ArchiveWriter
from heed.transfer.rows import (
    ChunkRow,
    DocumentRow,
    EntityRow,
    LinkRow,
    MembershipRow,
)

PER_DOCUMENT = 400


def synthetic_archive(units: int) -> bytes:
    """A bank archive of *units* memories (see the module docstring)."""
    rng = np.random.default_rng(7)
    out = io.BytesIO()
    writer = ArchiveWriter(
        out, scope="bank", source_bank_id="synthetic", embedding_model=MODEL, dim=DIM
    )
    writer.bank(Bank(tenant="t", bank_id="synthetic", ref="r", name="synthetic", created_at=NOW))
    speakers = [EntityRow(str(uuid.uuid4()), f"Speaker{s}", "person") for s in range(SPEAKERS)]
    documents, pages = [], []
    for d, start in enumerate(range(0, units, PER_DOCUMENT)):
        document_id = f"doc-{d:05d}"
        chunk = ChunkRow(str(uuid.uuid4()), 0, f"the conversation {document_id}")
        page = []
        for i in range(start, min(units, start + PER_DOCUMENT)):
            page.append(turn(i, document_id, chunk.id, rng.standard_normal(DIM).astype(np.float32)))
        pages.append(page)
        documents.append(
            DocumentRow(
                document_id,
                "\n".join(u.text for u in page),
                None,
                {},
                [],
                NOW,
                NOW,
                len(page),
                [chunk],
            )
        )
    writer.write("documents", documents)
    for page in pages:
        writer.write("units", page)
    writer.write("entities", speakers)
    for page in pages:
        writer.write(
            "unit_entities",
            [MembershipRow(u.id, speakers[int(u.text[7]) % SPEAKERS].id) for u in page],
        )
    for page in pages:
        links = [LinkRow(a.id, b.id, "temporal", 1.0) for a, b in itertools.pairwise(page)]
        writer.write("links", links)
    writer.finish()
    return out.getvalue()


def _rss_mb(server: Server) -> float:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class RssSampler:
    """The server's RSS every 50 ms, in a thread, while a block runs."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append(_rss_mb(self.server))

    def __enter__(self) -> RssSampler:
        self.before = _rss_mb(self.server)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def figures(self) -> dict[str, float]:
        peak = max(self.samples, default=self.before)
        return {
            "rss_before_mb": round(self.before, 1),
            "rss_peak_mb": round(peak, 1),
            "rss_growth_mb": round(peak - self.before, 1),
        }


async def _finished(http: httpx.AsyncClient, run_id: str, seconds: float = 600) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        run = await _run(http, run_id)
        return run if run["finished_at"] is not None else None

    run: dict[str, Any] = await _until(done, seconds, 0.005)
    return run


async def _processing(http: httpx.AsyncClient, bank: str, run_id: str) -> None:
    """Return once the operation's progress shows rows done, not all."""

    async def check() -> bool:
        response = await http.get(f"/v1/default/banks/{bank}/operations/{run_id}")
        status = response.json()
        progress = status.get("progress") or {}
        if status["status"] in ("completed", "failed", "cancelled"):
            raise RuntimeError(f"{run_id} ended before it was cancelled: {status}")
        return bool(0 < progress.get("processed", 0) < progress.get("total", 0))

    await _until(check, 120, 0.01)


async def _import(http: httpx.AsyncClient, bank: str, archive: bytes, target: str) -> str:
    response = await http.post(
        f"/v1/default/banks/{bank}/transfer/import",
        params={"target_bank_id": target},
        files={"file": ("bank.zip", archive, "application/zip")},
    )
    response.raise_for_status()
    return str(response.json()["operation_id"])


async def _whole(
    http: httpx.AsyncClient, server: Server, archive: bytes, units: int
) -> dict[str, Any]:
    """Import, export and clone the whole bank, timed, with RSS."""
    out: dict[str, Any] = {"units": units, "archive_bytes": len(archive)}
    (await http.put("/v1/default/banks/host", json={})).raise_for_status()
    with RssSampler(server) as upload:
        started = time.perf_counter()
        run_id = await _import(http, "host", archive, "big")
        submitted = time.perf_counter()
    with RssSampler(server) as rss:
        run = await _finished(http, run_id)
        assert run["phase"] == "completed", run
        seconds = time.perf_counter() - submitted
    out["import"] = {
        "upload_and_check_seconds": round(submitted - started, 2),
        "run_seconds": round(seconds, 2),
        "units_per_second": round(units / seconds, 1),
        # The upload is a request body the server reads whole (HEED_MAX_BODY_BYTES): its
        # memory is the request's; the run starts with it still in the process's RSS.
        "rss_before_upload_mb": round(upload.before, 1),
        "rss_after_upload_mb": round(rss.before, 1),
        "rss_peak_during_run_mb": rss.figures()["rss_peak_mb"],
        "rss_end_of_run_mb": round(rss.samples[-1] if rss.samples else rss.before, 1),
        "run_rss_growth_mb": rss.figures()["rss_growth_mb"],
    }
    with RssSampler(server) as rss:
        started = time.perf_counter()
        response = await http.post("/v1/default/banks/big/transfer/export")
        run = await _finished(http, response.json()["operation_id"])
        assert run["phase"] == "completed", run
        seconds = time.perf_counter() - started
    out["export"] = {
        "seconds": round(seconds, 2),
        "units_per_second": round(units / seconds, 1),
        "archive_bytes": run["result"]["byte_size"],
        **rss.figures(),
    }
    with RssSampler(server) as rss:
        started = time.perf_counter()
        response = await http.post(
            "/v1/default/banks/big/clone", params={"target_bank_id": "big-clone"}
        )
        run = await _finished(http, response.json()["operation_id"])
        assert run["phase"] == "completed", run
        seconds = time.perf_counter() - started
    out["clone"] = {
        "seconds": round(seconds, 2),
        "units_per_second": round(units / seconds, 1),
        **rss.figures(),
    }
    return out


async def _cancel_trials(
    http: httpx.AsyncClient,
    trials: int,
    start: Callable[[str], Awaitable[tuple[str, str]]],
    *,
    into_existing: bool = False,
) -> dict[str, Any]:
    """*trials* times: *start* an operation (its bank and run id), cancel it while it
    processes, measure its stop. An operation that ended before the cancel arrived is not
    a trial (counted as ``finished_first``). The target bank must not exist afterwards,
    unless the operation writes *into_existing* (a merge): then it is deleted."""
    stops: list[float] = []
    finished_first = 0
    while len(stops) < trials:
        target = f"cancelled-{len(stops)}-{uuid.uuid4().hex[:6]}"
        bank, run_id = await start(target)
        try:
            await _processing(http, bank, run_id)
        except RuntimeError:
            finished_first += 1
            continue
        await asyncio.sleep(random.uniform(0.0, 0.2))
        sent = time.time()
        (await http.post(f"/v1/runs/{run_id}/cancel")).raise_for_status()
        run = await _finished(http, run_id, 30)
        if run["phase"] == "completed":
            finished_first += 1
            await http.delete(f"/v1/default/banks/{target}")
            continue
        stops.append(float(run["finished_at"]) - sent)
        assert run["phase"] == "cancelled", run
        if into_existing:
            (await http.delete(f"/v1/default/banks/{target}")).raise_for_status()
            continue
        assert (await http.get(f"/v1/default/banks/{target}")).status_code == 404, target
    return {"trials": trials, "finished_first": finished_first, **_summary(stops)}


async def _delete_trials(http: httpx.AsyncClient, trials: int, archive: bytes) -> dict[str, Any]:
    responses: list[float] = []
    stops: list[float] = []
    for trial in range(trials):
        bank, target = f"doomed-{trial}", f"never-{trial}"
        (await http.put(f"/v1/default/banks/{bank}", json={})).raise_for_status()
        run_id = await _import(http, bank, archive, target)
        await _processing(http, bank, run_id)
        await asyncio.sleep(random.uniform(0.0, 0.2))
        sent = time.time()
        t0 = time.perf_counter()
        (await http.delete(f"/v1/default/banks/{bank}")).raise_for_status()
        responses.append(time.perf_counter() - t0)
        run = await _finished(http, run_id, 30)
        stops.append(float(run["finished_at"]) - sent)
        assert run["phase"] == "cancelled" and run["cancel_reason"] == "bank deleted", run
        assert (await http.get(f"/v1/default/banks/{target}")).status_code == 404
    return {
        "trials": trials,
        "delete_response": _summary(responses),
        "run_stopped": _summary(stops),
    }


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _vacuum(url: str) -> float:
    """``VACUUM ANALYZE`` the database at *url* once the trials' staging banks are deleted
    (their background deletes end within seconds); its seconds."""
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(300):
            left = conn.execute(
                "SELECT COUNT(*) FROM memory_banks WHERE tenant = ',transfer-staging'"
            ).fetchone()
            if left is None or left[0] == 0:
                break
            time.sleep(0.1)
        started = time.perf_counter()
        conn.execute("VACUUM ANALYZE")
        return round(time.perf_counter() - started, 2)


def _staging_banks(data_dir: Path, postgres_url: str | None) -> int | None:
    """Staging banks left (SQLite only; ``None`` when not checked)."""
    if postgres_url is not None:
        return None
    with sqlite3.connect(f"file:{data_dir / 'heed.db'}?mode=ro", uri=True) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM memory_banks WHERE tenant = ',transfer-staging'"
        ).fetchone()
    return int(row[0])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    print(f"archive of {args.units} memories")
    archive = synthetic_archive(args.units) if args.units else b""
    small = synthetic_archive(args.cancel_units)
    out: dict[str, Any] = {"database": "postgresql" if args.postgres else "sqlite"}
    loads: dict[str, float] = {}
    out["load_average_1m_at_start_of"] = loads
    with ExitStack() as stack:
        data_dir = Path(tempfile.mkdtemp(prefix="heed-transfer-"))
        env = {"HEED_LLM_PROVIDER": "scripted", "HEED_MAX_BODY_BYTES": str(512 * 1024 * 1024)}
        url = None
        if args.postgres:
            url = env["HEED_DATABASE_URL"] = stack.enter_context(postgres())
            out["postgres_writers"] = PG_WRITERS
        server = stack.enter_context(serve(data_dir, env))
        async with httpx.AsyncClient(base_url=server.url, timeout=600) as http:
            (await http.put("/v1/default/banks/host", json={})).raise_for_status()

            async def start_import(target: str) -> tuple[str, str]:
                return "host", await _import(http, "host", small, target)

            (await http.put("/v1/default/banks/source", json={})).raise_for_status()
            run_id = await _import(http, "source", small, "cancel-source")
            assert (await _finished(http, run_id))["phase"] == "completed"

            async def start_clone(target: str) -> tuple[str, str]:
                response = await http.post(
                    "/v1/default/banks/cancel-source/clone", params={"target_bank_id": target}
                )
                response.raise_for_status()
                return "cancel-source", str(response.json()["operation_id"])

            async def start_export(target: str) -> tuple[str, str]:
                response = await http.post("/v1/default/banks/cancel-source/transfer/export")
                response.raise_for_status()
                return "cancel-source", str(response.json()["operation_id"])

            async def start_merge(target: str) -> tuple[str, str]:
                (await http.put(f"/v1/default/banks/{target}", json={})).raise_for_status()
                response = await http.post(
                    f"/v1/default/banks/{target}/transfer/import",
                    params={"mode": "merge"},
                    files={"file": ("bank.zip", small, "application/zip")},
                )
                response.raise_for_status()
                return target, str(response.json()["operation_id"])

            out["cancel_while_processing"] = {}
            loads["cancels"] = _load()
            starts = {
                "import": start_import,
                "clone": start_clone,
                "export": start_export,
                "merge": start_merge,
            }
            for name in args.kinds.split(","):
                print(f"cancel {name}: {args.trials} trials")
                result = await _cancel_trials(
                    http, args.trials, starts[name], into_existing=name == "merge"
                )
                out["cancel_while_processing"][name] = result
                print(f"  {result}")
            if args.delete_trials:
                print(f"bank delete: {args.delete_trials} trials")
                out["bank_delete_while_importing"] = await _delete_trials(
                    http, args.delete_trials, small
                )
                print(f"  {out['bank_delete_while_importing']}")
            # Last: a whole bank's transfers (their deletes would leave the database
            # vacuuming beside the cancels above).
            if url is not None and args.units:
                out["vacuum_before_whole_seconds"] = await asyncio.to_thread(_vacuum, url)
                print(f"vacuum before the whole transfers: {out['vacuum_before_whole_seconds']} s")
            if args.units:
                loads["whole"] = _load()
                print("whole transfers")
                out["whole"] = await _whole(http, server, archive, args.units)
                print(f"  {out['whole']}")
            await asyncio.sleep(2)  # the staging banks' background deletes
        out["staging_banks_left"] = _staging_banks(data_dir, url)
    out["cancel_units"] = args.cancel_units
    cancels = out["cancel_while_processing"]
    worst = max(c["p99_ms"] for c in cancels.values())
    deleted = out.get("bank_delete_while_importing")
    out["targets"] = {
        "cancel_p99_ms": {"target": 50, "worst": worst, "met": worst <= 50},
        "bank_delete_run_stopped_p99_ms": deleted["run_stopped"]["p99_ms"] if deleted else None,
        "nothing_left": out["staging_banks_left"] in (0, None),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--units", type=int, default=20_000, help="memories of the whole bank")
    parser.add_argument(
        "--cancel-units", type=int, default=8_000, help="memories of the banks cancelled"
    )
    parser.add_argument("--trials", type=int, default=40, help="cancels per kind")
    parser.add_argument(
        "--kinds",
        default="import,clone,export,merge",
        help="which operations to cancel (comma-separated: import, clone, export, merge)",
    )
    parser.add_argument("--delete-trials", type=int, default=15, help="bank deletes")
    parser.add_argument("--postgres", action="store_true", help="store in PostgreSQL (pgvector)")
    parser.add_argument("--name", default=None, help="results file name")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    name = args.name or "transfer_cancel" + ("_postgres" if args.postgres else "")
    path = write_result(name, result)
    print(result["targets"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
