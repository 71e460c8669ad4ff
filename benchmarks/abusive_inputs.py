"""Abusive inputs: does one request, connection or client stall the server? (issue 28)

Against a real ``heed serve`` (two API keys, scripted LLM, SQLite, default limits and
timeouts), each scenario runs while a poller in this process asks ``GET /health`` every
10 ms on a kept-alive connection; the figure that matters is the slowest /health answer
during the scenario (the event loop's longest stall as a client sees it), against the
issue's target of 50 ms.

Scenarios (the issue's reproductions):

- ``tags_60000``: three retains of one item with 60,000 distinct tags (644 KB each);
- ``retain_1000_items_64_tags``: the largest list a client may send under the count
  limits, accepted: 1,000 items with 64 tags each and 64 document tags;
- ``header_150mb``: one socket sends ``GET /health`` with a header of up to 150 MB;
  measured: the bytes the server took before it answered 431 and closed;
- ``idle_1100``: 1,100 connections that never send a request; measured: /health during,
  and how long until the server has closed all of them (the head timeout, 10 s);
- ``stalled_bodies``: 96 ``POST /v1/auth/login`` and 32 ``POST /v1/sessions`` (tenant A)
  announcing 100 bytes of body and sending none; measured: a login and tenant B's request
  served meanwhile, and when the stalled ones were dropped (the body timeout, 30 s);
- ``run_listing``: 20 async retains of 4.9 MB, each cancelled, then ``GET /v1/runs?limit=100``
  four times in parallel; measured: the listing's size and time, the server's RSS growth;
- ``queued_turns``: 40 turns of 198 KB enqueued behind a long turn of one session; measured:
  how many were queued before the 429, the enqueue latency, server CPU while they wait;
- ``idle_streams``: 3,000 ``GET /v1/runs/{queued}/stream`` opened by one tenant; measured: how
  many were served before the 429, server CPU and RSS while they sit idle for 10 s;
- ``key_guessing``: 300 wrong keys to ``/v1/auth/login``; measured: 401s before the 429s.

Issue 37's files and archives, each while tenant B retains one item every 100 ms (its
latency idle and during is the second figure, against the same 50 ms):

- ``file_bombs``: the probe's files, a few kilobytes each (sheets declaring 16,384 columns
  by 150,000, 300,000 and 100,000,000 rows, a docx cell spanning 50,000,000 columns, a docx
  of 11,000,000 empty paragraphs, 22,000 and 200,000 nested ``<div>``), then two 300,000-row
  sheets at once; measured: each answer and its time, the CPU of the parsing children;
- ``file_parse_cancel``: a client that leaves while a 6 MB page of 1,800,000 tags is parsed
  (seconds of CPU: the whole request is timed first), 10 times;
  measured: how long until the parsing child is gone (target 1 s);
- ``archive_check_memory``: merges of a documents archive of 250,000 entities with ids of
  500 and names of 1,900 characters (the last a duplicate: a 400 after every record) and
  of one 15 MB line of empty objects; measured: the server's peak RSS growth.

Writes ``benchmarks/results/abusive_inputs.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from _server import Server, percentile, scripted_env, serve, write_result
from _synthetic import DIM, MODEL

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' file builders

KEY_A, KEY_B = "bench-key-a-0123456789", "bench-key-b-0123456789"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
TARGET_STALL_MS = 50.0


class HealthPoller:
    """Asks /health every *interval* seconds in a thread; records each answer's latency."""

    def __init__(self, url: str, interval: float = 0.01) -> None:
        self.url = url
        self.interval = interval
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    ok = client.get("/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self.latencies.append((time.perf_counter() - started) * 1000)
                else:
                    self.failures += 1
                self._stop.wait(self.interval)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        values = self.latencies
        return {
            "health_requests": len(values),
            "health_failures": self.failures,
            "health_p50_ms": round(percentile(values, 50), 2) if values else None,
            "health_p99_ms": round(percentile(values, 99), 2) if values else None,
            "health_max_ms": round(max(values), 2) if values else None,
        }


def _during(server: Server, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    cpu_before = server.cpu_seconds()
    started = time.perf_counter()
    with HealthPoller(server.url) as poller:
        time.sleep(0.3)  # a few unloaded answers first
        result = work()
        time.sleep(0.3)
    return {
        **result,
        **poller.summary(),
        "seconds": round(time.perf_counter() - started, 2),
        "server_cpu_seconds": round(server.cpu_seconds() - cpu_before, 3),
    }


def _connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def _closed_by_server(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before it closed, or None if it is still open after *seconds*."""
    sock.settimeout(seconds)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return b"".join(chunks)


# -- scenarios ---------------------------------------------------------------------------------


def tags_60000(server: Server) -> dict[str, Any]:
    body = json.dumps(
        {"items": [{"content": "x", "tags": [f"tag-{i}" for i in range(60_000)]}]}
    ).encode()
    statuses: list[int] = []
    with httpx.Client(base_url=server.url, headers=A, timeout=60) as http:
        http.put("/v1/default/banks/abuse", json={})

        def work() -> dict[str, Any]:
            for _ in range(3):
                response = http.post(
                    "/v1/default/banks/abuse/memories",
                    content=body,
                    headers={"Content-Type": "application/json"},
                )
                statuses.append(response.status_code)
            return {"body_bytes": len(body), "statuses": statuses}

        return _during(server, work)


def retain_1000_items(server: Server) -> dict[str, Any]:
    items = [
        {"content": f"Item {i} says something short.", "tags": [f"t{i}-{j}" for j in range(64)]}
        for i in range(1_000)
    ]
    body = json.dumps({"items": items, "document_tags": [f"d{k}" for k in range(64)]}).encode()
    with httpx.Client(base_url=server.url, headers=A, timeout=300) as http:
        http.put("/v1/default/banks/wide", json={})

        def work() -> dict[str, Any]:
            started = time.perf_counter()
            response = http.post(
                "/v1/default/banks/wide/memories",
                content=body,
                headers={"Content-Type": "application/json"},
            )
            return {
                "body_bytes": len(body),
                "status": response.status_code,
                "retain_seconds": round(time.perf_counter() - started, 2),
            }

        return _during(server, work)


def header_150mb(server: Server) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        sent = 0
        chunk = b"a" * 65536
        with _connect(server) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                while sent < 150 * 1024 * 1024:
                    sock.sendall(chunk)
                    sent += len(chunk)
            answer = _closed_by_server(sock, 10) or b""
        return {"header_bytes_sent_before_close": sent, "answer": answer[:12].decode()}

    return _during(server, work)


def idle_1100(server: Server) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        socks = [_connect(server) for _ in range(1_100)]
        opened = time.perf_counter()
        try:
            closed_after = []
            for sock in socks:
                left = max(0.1, 30 - (time.perf_counter() - opened))
                if _closed_by_server(sock, left) is not None:
                    closed_after.append(time.perf_counter() - opened)
        finally:
            for sock in socks:
                sock.close()
        return {
            "connections": len(socks),
            "closed_by_server": len(closed_after),
            "all_closed_after_s": round(max(closed_after), 2) if closed_after else None,
        }

    return _during(server, work)


def _stalled(server: Server, path: str, headers: str) -> socket.socket:
    sock = _connect(server)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode()
    )
    return sock


def stalled_bodies(server: Server) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        socks = [_stalled(server, "/v1/auth/login", "") for _ in range(96)]
        socks += [
            _stalled(server, "/v1/sessions", f"Authorization: Bearer {KEY_A}\r\n")
            for _ in range(32)
        ]
        opened = time.perf_counter()
        time.sleep(0.5)
        try:
            started = time.perf_counter()
            login = httpx.post(f"{server.url}/v1/auth/login", json={"key": KEY_B}, timeout=30)
            login_ms = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            other = httpx.get(f"{server.url}/v1/sessions", headers=B, timeout=30)
            other_ms = (time.perf_counter() - started) * 1000
            dropped = [
                time.perf_counter() - opened
                for sock in socks
                if _closed_by_server(sock, max(0.1, 60 - (time.perf_counter() - opened)))
                is not None
            ]
        finally:
            for sock in socks:
                sock.close()
        return {
            "stalled": len(socks),
            "login_status": login.status_code,
            "login_ms": round(login_ms, 1),
            "tenant_b_status": other.status_code,
            "tenant_b_ms": round(other_ms, 1),
            "dropped_by_server": len(dropped),
            "all_dropped_after_s": round(max(dropped), 2) if dropped else None,
        }

    return _during(server, work)


def key_guessing(server: Server) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        counts: dict[int, int] = {}
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for i in range(300):
                status = http.post("/v1/auth/login", json={"key": f"guess-{i}"}).status_code
                counts[status] = counts.get(status, 0) + 1
        return {"statuses": {str(k): v for k, v in sorted(counts.items())}}

    return _during(server, work)


def _rss_mb(server: Server) -> float:
    for line in open(f"/proc/{server.proc.pid}/status").read().splitlines():  # noqa: SIM115
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_listing(server: Server) -> dict[str, Any]:
    item = {"content": "Ottoline keeps three tabby cats. " * 150}  # ~4.9 KB
    body = json.dumps({"items": [item] * 1_000, "async": True}).encode()  # ~4.9 MB

    def work() -> dict[str, Any]:
        with httpx.Client(base_url=server.url, headers=A, timeout=120) as http:
            http.put("/v1/default/banks/bulky", json={})
            for _ in range(20):
                answer = http.post(
                    "/v1/default/banks/bulky/memories",
                    content=body,
                    headers={"Content-Type": "application/json"},
                ).json()
                http.delete(f"/v1/default/banks/bulky/operations/{answer['operation_id']}")
            rss_before = _rss_mb(server)
            started = time.perf_counter()
            listing = http.get("/v1/runs", params={"limit": 100})
            listing_ms = (time.perf_counter() - started) * 1000

            def four() -> list[int]:
                with httpx.Client(base_url=server.url, headers=A, timeout=120) as c:
                    return [len(c.get("/v1/runs", params={"limit": 100}).content)]

            threads = [threading.Thread(target=four) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        return {
            "request_body_bytes": len(body),
            "listing_status": listing.status_code,
            "listing_bytes": len(listing.content),
            "listing_runs": len(listing.json().get("runs", [])),
            "listing_ms": round(listing_ms, 1),
            "rss_growth_4_parallel_listings_mb": round(_rss_mb(server) - rss_before, 1),
        }

    return _during(server, work)


def _long_turn(http: httpx.Client) -> str:
    session = http.post("/v1/sessions", json={"title": "abuse"}).json()["id"]
    words = " ".join(f"w{i}" for i in range(3_000))  # 0.05 s a word: longer than the scenario
    assert http.post(f"/v1/sessions/{session}/turns", json={"content": words}).status_code == 202
    return session


def queued_turns(server: Server) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        content = "word " * 39_600  # 198 KB
        statuses: dict[int, int] = {}
        latencies = []
        with httpx.Client(base_url=server.url, headers=A, timeout=60) as http:
            session = _long_turn(http)
            for _ in range(40):
                started = time.perf_counter()
                status = http.post(
                    f"/v1/sessions/{session}/turns",
                    json={"content": content, "multitask_strategy": "enqueue"},
                ).status_code
                latencies.append((time.perf_counter() - started) * 1000)
                statuses[status] = statuses.get(status, 0) + 1
            cpu_before = server.cpu_seconds()
            time.sleep(5)
            waiting_cpu = (server.cpu_seconds() - cpu_before) / 5
        return {
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "enqueue_p50_ms": round(percentile(latencies, 50), 1),
            "enqueue_max_ms": round(max(latencies), 1),
            "server_cores_while_queued_and_one_turn_streams": round(waiting_cpu, 3),
        }

    return _during(server, work)


async def _open_streams(server: Server, run_id: str, count: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, headers=B, timeout=60, limits=limits) as c:
        opened: list[Any] = []
        statuses: dict[int, int] = {}
        for _ in range(count):
            request = c.build_request("GET", f"/v1/runs/{run_id}/stream")
            response = await c.send(request, stream=True)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code == 200:
                opened.append(response)
            else:
                await response.aclose()
        await asyncio.sleep(1)
        rss_before = _rss_mb(server)
        cpu_before = server.cpu_seconds()
        await asyncio.sleep(10)
        idle_cores = (server.cpu_seconds() - cpu_before) / 10
        rss_after = _rss_mb(server)
        for response in opened:
            await response.aclose()
    return {
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "server_cores_while_idle": round(idle_cores, 3),
        "rss_mb_while_idle": round(rss_after, 1),
        "rss_growth_over_10s_idle_mb": round(rss_after - rss_before, 1),
    }


def idle_streams(server: Server) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        with httpx.Client(base_url=server.url, headers=B, timeout=60) as http:
            session = _long_turn(http)
            queued = http.post(
                f"/v1/sessions/{session}/turns",
                json={"content": "later", "multitask_strategy": "enqueue"},
            ).json()["run_id"]
            rss_before = _rss_mb(server)
        result = asyncio.run(_open_streams(server, queued, 3_000))
        return {**result, "rss_growth_mb": round(result["rss_mb_while_idle"] - rss_before, 1)}

    return _during(server, work)


# -- issue 37: files and archives whose work followed what they declare --------------------


def _children_of(pid: int) -> dict[int, list[int]]:
    """Every process's children, by parent pid (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _descendants(pid: int) -> list[int]:
    tree, out, todo = _children_of(pid), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _children_cpu(server: Server) -> float:
    """CPU seconds of the server's descendants: the reaped ones (counted in their parents'
    cutime and cstime) and the running ones."""
    total = 0
    for pid in _descendants(server.proc.pid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


class TenantProbe:
    """Tenant B retains one short item every *interval* seconds in a thread; records each
    retain's latency (the other tenant's work, as the issue measures it)."""

    def __init__(self, url: str, interval: float = 0.1) -> None:
        self.url = url
        self.interval = interval
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, headers=B, timeout=60) as client:
            client.put("/v1/default/banks/probe", json={})
            n = 0
            while not self._stop.is_set():
                n += 1
                started = time.perf_counter()
                item = {"items": [{"content": f"Probe {n}: Bea waters the ferns."}]}
                ok = client.post("/v1/default/banks/probe/memories", json=item).status_code == 200
                if ok:
                    self.latencies.append((time.perf_counter() - started) * 1000)
                else:
                    self.failures += 1
                self._stop.wait(self.interval)

    def __enter__(self) -> TenantProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, prefix: str) -> dict[str, Any]:
        values = self.latencies
        return {
            f"{prefix}_retains": len(values),
            f"{prefix}_retain_failures": self.failures,
            f"{prefix}_retain_p50_ms": round(percentile(values, 50), 2) if values else None,
            f"{prefix}_retain_p99_ms": round(percentile(values, 99), 2) if values else None,
            f"{prefix}_retain_max_ms": round(max(values), 2) if values else None,
        }


def _with_tenant_b(server: Server, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """*work* (tenant A's) while tenant B retains and /health is polled, after B's baseline."""
    with TenantProbe(server.url) as idle:
        time.sleep(2.0)
    children_before = _children_cpu(server)
    with TenantProbe(server.url) as busy:
        result = _during(server, work)
    return {
        **result,
        "parse_children_cpu_seconds": round(_children_cpu(server) - children_before, 3),
        **idle.summary("b_idle"),
        **busy.summary("b_during"),
    }


def _post_file(http: httpx.Client, bank: str, name: str, data: bytes) -> dict[str, Any]:
    started = time.perf_counter()
    response = http.post(f"/v1/default/banks/{bank}/files/retain", files=[("files", (name, data))])
    detail = response.json().get("detail") if response.status_code >= 400 else None
    return {
        "bytes": len(data),
        "status": response.status_code,
        "seconds": round(time.perf_counter() - started, 3),
        "detail": detail,
    }


def _bombs() -> dict[str, tuple[str, bytes]]:
    from tests.memory import file_samples as samples  # the tests' own builders of these files

    return {
        "xlsx_dimension_150000_rows": ("a.xlsx", samples.xlsx_dimension_bomb(150_000)),
        "xlsx_dimension_300000_rows": ("b.xlsx", samples.xlsx_dimension_bomb(300_000)),
        "xlsx_dimension_100000000_rows": ("c.xlsx", samples.xlsx_dimension_bomb(100_000_000)),
        "docx_gridspan_50000000": ("d.docx", samples.docx_gridspan_bomb(50_000_000)),
        "docx_11000000_empty_paragraphs": ("e.docx", samples.docx_paragraph_bomb(11_000_000)),
        "html_22000_nested_divs": ("f.html", samples.html_nested(22_000)),
        "html_1mb_nested_divs": ("g.html", samples.html_nested(200_000)),
    }


def file_bombs(server: Server) -> dict[str, Any]:
    """Each of the probe's files (findings 1-3), one after another, then two 300,000-row
    sheets at once (both retain slots), while tenant B retains."""
    bombs = _bombs()

    def work() -> dict[str, Any]:
        files: dict[str, Any] = {}
        with httpx.Client(base_url=server.url, headers=A, timeout=600) as http:
            http.put("/v1/default/banks/files", json={})
            for case, (name, data) in bombs.items():
                files[case] = _post_file(http, "files", name, data)
            name, data = bombs["xlsx_dimension_300000_rows"]
            pair: list[dict[str, Any]] = []
            threads = [
                threading.Thread(target=lambda: pair.append(_post_file(http, "files", name, data)))
                for _ in range(2)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            files["two_xlsx_300000_rows_at_once"] = pair
        return {"files": files, "rss_mb_after": round(_rss_mb(server), 1)}

    return _with_tenant_b(server, work)


def _big_html(elements: int) -> bytes:
    """A legitimate page of *elements* empty elements and a word: seconds to read, within
    every limit (8 MiB, 2,000,000 tags)."""
    return b"<b></b>" * elements + b"Bees."


def file_parse_cancel(server: Server) -> dict[str, Any]:
    """A client that leaves while its file is parsed: how long until the parsing child is
    gone (the issue's target: 1 s), over 10 trials."""
    page = _big_html(900_000)

    def work() -> dict[str, Any]:
        gone_ms: list[float] = []
        baseline = len(_descendants(server.proc.pid))
        with httpx.Client(base_url=server.url, headers=A, timeout=60) as http:
            http.put("/v1/default/banks/leaver", json={})
            whole = _post_file(http, "leaver", "page.html", page)  # how long a parse takes
        for _ in range(10):
            sock = _connect(server)
            boundary = "b0undary"
            head = (
                f'--{boundary}\r\nContent-Disposition: form-data; name="files"; '
                'filename="page.html"\r\nContent-Type: text/html\r\n\r\n'
            ).encode()
            body = head + page + f"\r\n--{boundary}--\r\n".encode()
            sock.sendall(
                (
                    "POST /v1/default/banks/leaver/files/retain HTTP/1.1\r\n"
                    f"Host: 127.0.0.1\r\nAuthorization: Bearer {KEY_A}\r\n"
                    f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                ).encode()
                + body
            )
            deadline = time.monotonic() + 30
            while len(_descendants(server.proc.pid)) <= baseline:  # its child started
                if time.monotonic() > deadline:
                    raise SystemExit("no parsing child appeared")
                time.sleep(0.002)
            time.sleep(0.3)
            left = time.perf_counter()
            sock.close()
            while len(_descendants(server.proc.pid)) > baseline:
                time.sleep(0.002)
            gone_ms.append((time.perf_counter() - left) * 1000)
        return {
            "page_bytes": len(page),
            "whole_request": whole,
            "trials": len(gone_ms),
            "child_gone_p50_ms": round(percentile(gone_ms, 50), 1),
            "child_gone_max_ms": round(max(gone_ms), 1),
        }

    return _during(server, work)


def _entities_archive(records: int) -> bytes:
    """A documents archive of *records* entities with ids of 500 and names of 1,900
    characters, the last one's name a duplicate (a 400 once every record was read)."""
    import io

    from heed.transfer.archive import ArchiveWriter
    from heed.transfer.rows import EntityRow

    out = io.BytesIO()
    writer = ArchiveWriter(
        out, scope="documents", source_bank_id="big", embedding_model=MODEL, dim=DIM
    )
    batch: list[EntityRow] = []
    first = ""
    for i in range(records):
        name = f"{i:09d} {uuid.UUID(int=i * 7919).hex} " + "n" * 1850
        first = first or name
        batch.append(EntityRow(f"{i:09d}-" + "i" * 490, name if i < records - 1 else first, None))
        if len(batch) == 5000:
            writer.write("entities", batch)
            batch = []
    if batch:
        writer.write("entities", batch)
    writer.finish()
    return out.getvalue()


def _peak_rss_mb(server: Server) -> float:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def archive_check_memory(server: Server) -> dict[str, Any]:
    """Finding 4: merges of a documents archive of 250,000 long entity records and of one
    15 MB line of empty objects; the server's peak RSS growth, /health and tenant B."""
    archive = _entities_archive(250_000)
    line = b'{"id": [' + b"{}," * 5_000_000 + b"{}]}\n"
    import io
    import zipfile

    one_line = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(_entities_archive(1))) as source,
        zipfile.ZipFile(one_line, "w", zipfile.ZIP_STORED) as target,
    ):
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info.filename, line if info.filename.startswith("entities/") else data)

    def merge(http: httpx.Client, data: bytes) -> dict[str, Any]:
        Path(f"/proc/{server.proc.pid}/clear_refs").write_text("5")
        before = _peak_rss_mb(server)
        started = time.perf_counter()
        response = http.post(
            "/v1/default/banks/merged/transfer/import",
            params={"mode": "merge"},
            files={"file": ("bank.zip", data, "application/zip")},
        )
        return {
            "archive_bytes": len(data),
            "status": response.status_code,
            "detail": response.json().get("detail", "")[:200],
            "seconds": round(time.perf_counter() - started, 2),
            "peak_rss_growth_mb": round(_peak_rss_mb(server) - before, 1),
        }

    def work() -> dict[str, Any]:
        with httpx.Client(base_url=server.url, headers=A, timeout=600) as http:
            http.put("/v1/default/banks/merged", json={})
            return {
                "entities_250000": merge(http, archive),
                "line_of_5000000_empty_objects": merge(http, one_line.getvalue()),
            }

    return _with_tenant_b(server, work)


# -- admission: uploads, background work and exports (issue 37: findings 5, 8, 11) -------------
#
# Each starts a server of its own (the settings it needs; a data dir it can look into) and
# measures, while /health is polled, what one tenant's abuse costs the server and another
# tenant:
#
# - ``upload_spool``: tenant A sends 6 uploads of 200 MiB at once to .../transfer/import
#   (with ``Expect: 100-continue``, as curl does) while tenant B retains one item every
#   0.2 s. HEED_UPLOAD_SPOOL_TENANT_BYTES is 512 MiB here, so two are taken and four refused
#   before their body is sent. Measured: A's statuses and how soon the refusals came, the
#   peak spooled bytes (/metrics, and the spool directory's free space sampled every 10 ms),
#   the server's peak RSS, B's retain latency against its own baseline;
# - ``background_fairness``: tenant A creates 70 mental models with ``refresh_after_retain``
#   (each a refresh taking 0.2 s of a scripted LLM through the reflect lane's one background
#   slot), then tenant B creates one. Measured: how long B's refresh waited and ran, how
#   many of A's were still waiting when B's finished, whether any refresh failed;
# - ``export_quota``: tenant A exports one bank of 2,000 memories 25 times, then 20 other
#   banks once (HEED_EXPORT_TENANT_MAX_COUNT 16), while B retains. Measured: what is stored
#   (count, bytes: read from the data dir's database), the statuses, each export's time.

ADMISSION_METRICS_KEY = "bench-metrics-key-0123456789"
MIB = 1024 * 1024


@contextlib.contextmanager
def _admission_server(extra: dict[str, str]) -> Iterator[tuple[Server, str]]:
    env = {
        **scripted_env(0.0),
        "HEED_API_KEYS": f"{KEY_A}=a,{KEY_B}=b",
        "HEED_METRICS_KEY": ADMISSION_METRICS_KEY,
        **extra,
    }
    with (
        tempfile.TemporaryDirectory(prefix="heed-admission-") as data_dir,
        serve(data_dir, env) as server,
    ):
        yield server, data_dir


def _metric(server: Server, name: str) -> float | None:
    text = httpx.get(
        f"{server.url}/metrics",
        headers={"Authorization": f"Bearer {ADMISSION_METRICS_KEY}"},
        timeout=10,
    ).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


class _Retainer:
    """Tenant B retains one item every *interval* seconds in a thread; records latencies."""

    def __init__(self, server: Server, bank: str, interval: float = 0.2) -> None:
        self.server, self.bank, self.interval = server, bank, interval
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.server.url, headers=B, timeout=60) as http:
            i = 0
            while not self._stop.is_set():
                started = time.perf_counter()
                response = http.post(
                    f"/v1/default/banks/{self.bank}/memories",
                    json={"items": [{"content": f"B's note number {i}."}]},
                )
                if response.status_code == 200:
                    self.latencies.append((time.perf_counter() - started) * 1000)
                else:
                    self.failures += 1
                i += 1
                self._stop.wait(self.interval)

    def __enter__(self) -> _Retainer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, prefix: str) -> dict[str, Any]:
        values = self.latencies
        return {
            f"{prefix}_retains": len(values),
            f"{prefix}_retain_failures": self.failures,
            f"{prefix}_retain_p50_ms": round(percentile(values, 50), 1) if values else None,
            f"{prefix}_retain_p99_ms": round(percentile(values, 99), 1) if values else None,
            f"{prefix}_retain_max_ms": round(max(values), 1) if values else None,
        }


def _baseline_retains(server: Server, bank: str, count: int = 15) -> dict[str, Any]:
    retainer = _Retainer(server, bank, interval=0.05)
    with retainer:
        wait_until = time.monotonic() + 30
        while len(retainer.latencies) < count and time.monotonic() < wait_until:
            time.sleep(0.05)
    return retainer.summary("b_baseline")


def _new_bank(server: Server, headers: dict[str, str], bank: str) -> None:
    httpx.put(
        f"{server.url}/v1/default/banks/{bank}", json={}, headers=headers, timeout=30
    ).raise_for_status()


class _Sampler:
    """Samples the spool directory's free space and the server's RSS every 10 ms."""

    def __init__(self, server: Server, directory: str) -> None:
        self.server, self.directory = server, directory
        self.free_before = shutil.disk_usage(directory).free
        self.min_free = self.free_before
        self.peak_rss_mb = _rss_mb(server)
        self.rss_before_mb = self.peak_rss_mb
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.min_free = min(self.min_free, shutil.disk_usage(self.directory).free)
            self.peak_rss_mb = max(self.peak_rss_mb, _rss_mb(self.server))
            self._stop.wait(0.01)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _upload(server: Server, bank: str, size: int, outcome: dict[str, Any]) -> None:
    """One upload of *size* bytes over a raw socket, its body sent only after the server's
    ``100 Continue`` (the route checked it and reads it); *outcome* gets what happened."""
    boundary = "heedbenchboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        'filename="big.zip"\r\nContent-Type: application/zip\r\n\r\n'
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    block = bytes(range(256)) * (MIB // 256)
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as sock:
        sock.sendall(
            (
                f"POST /v1/default/banks/{bank}/transfer/import HTTP/1.1\r\n"
                f"Host: 127.0.0.1\r\nAuthorization: Bearer {KEY_A}\r\n"
                f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                f"Content-Length: {len(head) + size + len(tail)}\r\n"
                "Expect: 100-continue\r\n\r\n"
            ).encode()
        )
        first = sock.recv(65536)
        if first.startswith(b"HTTP/1.1 100"):
            sock.sendall(head)
            for _ in range(size // MIB):
                sock.sendall(block)
            sock.sendall(tail)
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
            outcome["body_sent"] = True
        else:
            answer = first
            outcome["body_sent"] = False
    outcome["status"] = int(answer.split()[1]) if answer else None
    outcome["seconds"] = round(time.perf_counter() - started, 3)


def upload_spool(_: Server) -> dict[str, Any]:
    extra = {"HEED_UPLOAD_SPOOL_TENANT_BYTES": str(512 * MIB)}
    with _admission_server(extra) as (server, _data_dir):
        _new_bank(server, A, "uploads")
        _new_bank(server, B, "notes")
        baseline = _baseline_retains(server, "notes")
        outcomes: list[dict[str, Any]] = []

        def work() -> dict[str, Any]:
            sampler = _Sampler(server, tempfile.gettempdir())
            with sampler, _Retainer(server, "notes") as retainer:
                time.sleep(0.5)
                for _wave in range(3):  # three waves of six, for enough of B's retains
                    wave: list[dict[str, Any]] = [{} for _ in range(6)]
                    threads = [
                        threading.Thread(target=_upload, args=(server, "uploads", 200 * MIB, o))
                        for o in wave
                    ]
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join()
                    outcomes.extend(wave)
                    time.sleep(0.5)
            refused = [o["seconds"] for o in outcomes if o.get("status") == 429]
            during = retainer.summary("b_during")
            return {
                "uploads": outcomes[:6],
                "statuses": {
                    str(k): sum(1 for o in outcomes if o.get("status") == k)
                    for k in sorted({o.get("status") or 0 for o in outcomes})
                },
                "refused_within_max_s": max(refused) if refused else None,
                "spool_peak_mb_metrics": _mb(_metric(server, "heed_upload_spool_peak_bytes")),
                "disk_used_peak_mb": round((sampler.free_before - sampler.min_free) / MIB, 1),
                "server_rss_before_mb": round(sampler.rss_before_mb, 1),
                "server_rss_peak_mb": round(sampler.peak_rss_mb, 1),
                **baseline,
                **during,
                "b_retain_p99_increase_ms": _increase(baseline, during),
            }

        return _during(server, work)


def _increase(baseline: dict[str, Any], during: dict[str, Any]) -> float | None:
    before, after = baseline.get("b_baseline_retain_p99_ms"), during.get("b_during_retain_p99_ms")
    return round(after - before, 1) if before is not None and after is not None else None


def _mb(value: float | None) -> float | None:
    return round(value / MIB, 1) if value is not None else None


def _run_phase(server: Server, run_id: str, headers: dict[str, str]) -> dict[str, Any]:
    run: dict[str, Any] = httpx.get(
        f"{server.url}/v1/runs/{run_id}", headers=headers, timeout=10
    ).json()
    return run


def _wait_run(server: Server, run_id: str, headers: dict[str, str], seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        run = _run_phase(server, run_id, headers)
        if run["phase"] in ("completed", "failed", "cancelled", "interrupted"):
            return run
        if time.monotonic() > deadline:
            return run
        time.sleep(0.02)


def background_fairness(_: Server) -> dict[str, Any]:
    script = {
        "replies": [
            {"when": "flood", "latency": 0.2, "text": "A flood answer."},
            {"when": "pets", "text": "Alice has two cats."},
        ]
    }
    extra = {"HEED_LLM_SCRIPT": json.dumps(script), "HEED_REFLECT_CONCURRENCY": "2"}
    with _admission_server(extra) as (server, _data_dir):
        for headers, bank in ((A, "flooded"), (B, "pets")):
            _new_bank(server, headers, bank)
            httpx.post(
                f"{server.url}/v1/default/banks/{bank}/memories",
                json={"items": [{"content": "Alice has two cats, Tom and Jerry."}]},
                headers=headers,
                timeout=30,
            ).raise_for_status()

        def work() -> dict[str, Any]:
            flood = []
            with httpx.Client(base_url=server.url, headers=A, timeout=30) as http:
                for i in range(70):
                    created = http.post(
                        "/v1/default/banks/flooded/mental-models",
                        json={
                            "name": f"flood {i}",
                            "source_query": f"flood {i}?",
                            "trigger": {"refresh_after_retain": True},
                        },
                    ).json()
                    flood.append(created["operation_id"])
            started = time.perf_counter()
            mine = httpx.post(
                f"{server.url}/v1/default/banks/pets/mental-models",
                json={"name": "pets", "source_query": "What pets does Alice have?"},
                headers=B,
                timeout=30,
            ).json()["operation_id"]
            run = _wait_run(server, mine, B, 300)
            b_seconds = time.perf_counter() - started
            a_open = sum(
                1
                for r in flood
                if _run_phase(server, r, A)["phase"] not in ("completed", "failed", "cancelled")
            )
            a_runs = [_wait_run(server, r, A, 300) for r in flood]
            a_seconds = time.perf_counter() - started
            phases = [r["phase"] for r in a_runs]
            return {
                "a_refreshes": len(flood),
                "a_phases": {p: phases.count(p) for p in sorted(set(phases))},
                "a_all_done_after_s": round(a_seconds, 1),
                "b_refresh_phase": run["phase"],
                "b_refresh_error": run.get("error"),
                "b_refresh_waited_and_ran_s": round(b_seconds, 2),
                "a_refreshes_still_open_when_b_finished": a_open,
            }

        return _during(server, work)


def _stored_exports(data_dir: str) -> tuple[int, int]:
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"{data_dir}/heed.db", timeout=30)) as conn:
        row = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(byte_size), 0) FROM transfer_archives"
            " WHERE kind = 'export'"
        ).fetchone()
    return int(row[0]), int(row[1])


def _export_and_wait(server: Server, bank: str) -> dict[str, Any]:
    started = time.perf_counter()
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/transfer/export", headers=A, timeout=60
    )
    if response.status_code != 202:
        return {"status": response.status_code, "seconds": time.perf_counter() - started}
    operation = response.json()["operation_id"]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = httpx.get(
            f"{server.url}/v1/default/banks/{bank}/operations/{operation}", headers=A, timeout=10
        ).json()
        if status["status"] in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.05)
    meta = status.get("result_metadata") or {}
    return {
        "status": 202,
        "outcome": status["status"],
        "reused": meta.get("reused"),
        "byte_size": meta.get("byte_size"),
        "seconds": time.perf_counter() - started,
    }


def export_quota(_: Server) -> dict[str, Any]:
    with _admission_server({}) as (server, data_dir):
        _new_bank(server, A, "big")
        items = [
            {"content": f"Memory {i}: Ottoline keeps {i % 7} tabby cats."} for i in range(2000)
        ]
        for start in range(0, len(items), 500):
            httpx.post(
                f"{server.url}/v1/default/banks/big/memories",
                json={"items": items[start : start + 500]},
                headers=A,
                timeout=300,
            ).raise_for_status()
        for i in range(20):
            _new_bank(server, A, f"small-{i}")
            httpx.post(
                f"{server.url}/v1/default/banks/small-{i}/memories",
                json={"items": [{"content": f"Small bank {i}."}]},
                headers=A,
                timeout=30,
            ).raise_for_status()
        _new_bank(server, B, "notes")
        baseline = _baseline_retains(server, "notes")

        def work() -> dict[str, Any]:
            with _Retainer(server, "notes") as retainer:
                same = [_export_and_wait(server, "big") for _ in range(25)]
                stored_after_same = _stored_exports(data_dir)
                others = [_export_and_wait(server, f"small-{i}") for i in range(20)]
            stored = _stored_exports(data_dir)

            def tally(results: list[dict[str, Any]]) -> dict[str, int]:
                keys = [
                    f"{r['status']}:{r.get('outcome', '')}:{'reused' if r.get('reused') else ''}"
                    for r in results
                ]
                return {k: keys.count(k) for k in sorted(set(keys))}

            return {
                "archive_bytes": same[0].get("byte_size"),
                "same_bank_25": tally(same),
                "same_bank_first_export_s": round(same[0]["seconds"], 2),
                "same_bank_reused_export_p50_s": round(
                    percentile([r["seconds"] for r in same[1:]], 50), 2
                ),
                "stored_after_same_bank": {
                    "count": stored_after_same[0],
                    "mb": round(stored_after_same[1] / MIB, 2),
                },
                "other_banks_20": tally(others),
                "stored_after_all": {"count": stored[0], "mb": round(stored[1] / MIB, 2)},
                **baseline,
                **retainer.summary("b_during"),
                "b_retain_p99_increase_ms": _increase(baseline, retainer.summary("b_during")),
            }

        return _during(server, work)


# -- webhooks (issue 37, findings 6 and 7) ------------------------------------------------------
# Each starts a server of its own (its webhooks target receivers on loopback, so it runs with
# HEED_WEBHOOK_ALLOW_PRIVATE) with the receivers in this process, and leaves the shared one be.
#
# - ``webhook_slow_target``: tenant B's retains, each delivered to B's webhook, first alone, then
#   while tenant A's four webhooks point at a target that answers 200 with ``Content-Length:
#   100000`` and then a byte a second and A's ten retains queue 80 deliveries to it; measured:
#   B's delivery latency (from its run's end to the receiver) in both phases, /health, and how
#   many of A's sends ran at once (A's share of the senders);
# - ``webhook_fanout``: 100 webhooks on one bank (the cap; the 101st is refused), then one async
#   retain of about 0.9 MB (2,000 documents) whose two events go to all of them; measured: the
#   webhook tables' growth, the bytes stored per event, the bytes sent, tenant B's writes and
#   /health while the events fan out and are sent.

_WH_ENV = {"HEED_WEBHOOK_ALLOW_PRIVATE": "true", "HEED_WEBHOOK_POLL_SECONDS": "0.05"}


class _WhReceiver:
    """Receivers on loopback: each request's path, wall-clock arrival and body; a path under
    ``/drip/`` answers 200 with ``Content-Length: 100000``, then a byte a second."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.arrivals: list[tuple[str, float, bytes]] = []
        self.dripping = 0
        self.most_dripping = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver.lock:
                    receiver.arrivals.append((self.path, time.time(), body))
                if self.path.startswith("/drip/"):
                    self._drip()
                    return
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def _drip(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "100000")
                self.end_headers()
                with receiver.lock:
                    receiver.dripping += 1
                    receiver.most_dripping = max(receiver.most_dripping, receiver.dripping)
                try:
                    while not receiver.stop.is_set():
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        receiver.stop.wait(1.0)
                except OSError:
                    pass
                finally:
                    with receiver.lock:
                        receiver.dripping -= 1
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _WhReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def at(self, prefix: str) -> list[tuple[str, float, bytes]]:
        with self.lock:
            return [a for a in self.arrivals if a[0].startswith(prefix)]


@contextlib.contextmanager
def _wh_server(**extra: str) -> Iterator[tuple[Server, str]]:
    env = {**scripted_env(0.05), "HEED_API_KEYS": f"{KEY_A}=a,{KEY_B}=b", **_WH_ENV, **extra}
    with tempfile.TemporaryDirectory(prefix="heed-hooks-") as data_dir, serve(data_dir, env) as s:
        with httpx.Client(base_url=s.url, headers=A, timeout=120) as http:  # models loaded
            http.put("/v1/default/banks/warm-up", json={}).raise_for_status()
            http.post(
                "/v1/default/banks/warm-up/memories", json={"items": [{"content": "Warm."}]}
            ).raise_for_status()
        time.sleep(2)
        yield s, data_dir


def _wh_wait(predicate: Callable[[], Any], seconds: float) -> Any:
    """*predicate*'s first truthy value within *seconds*, else ``None``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    return None


def _wh_finished_at(body: bytes) -> float:
    from datetime import datetime

    return datetime.fromisoformat(json.loads(body)["data"]["finished_at"]).timestamp()


def _wh_stats(values: list[float], name: str) -> dict[str, Any]:
    return {
        f"{name}_p50_ms": round(percentile(values, 50), 1),
        f"{name}_p99_ms": round(percentile(values, 99), 1),
        f"{name}_max_ms": round(max(values), 1) if values else None,
    }


def _wh_tenant_b(http: httpx.Client, rec: _WhReceiver, label: str, n: int) -> dict[str, Any]:
    """B's *n* async retains one after another, each awaited at B's receiver; the latency
    from each run's end to its delivery's arrival, and each retain request's."""
    bank = f"b-{label}"
    http.put(f"/v1/default/banks/{bank}", json={}).raise_for_status()
    hook = {"url": f"{rec.url}/b/{label}", "event_types": ["run.completed"]}
    http.post(f"/v1/default/banks/{bank}/webhooks", json=hook).raise_for_status()
    delivery_ms: list[float] = []
    retain_ms: list[float] = []
    for i in range(n):
        started = time.perf_counter()
        http.post(
            f"/v1/default/banks/{bank}/memories",
            json={"items": [{"content": f"Bea's note {i}: the kettle whistles."}], "async": True},
        ).raise_for_status()
        retain_ms.append((time.perf_counter() - started) * 1000)
        arrived = _wh_wait(lambda m=i + 1: len(a := rec.at(f"/b/{label}")) >= m and a, 60)
        if arrived is None:  # stuck behind another tenant: stop here, say so
            return {
                "b_delivered": len(delivery_ms),
                "b_not_delivered_within_s": 60,
                **_wh_stats(delivery_ms, "b_delivery"),
            }
        _, at, body = arrived[i]
        delivery_ms.append((at - _wh_finished_at(body)) * 1000)
    return {
        "b_delivered": len(delivery_ms),
        **_wh_stats(delivery_ms, "b_delivery"),
        **_wh_stats(retain_ms, "b_retain_request"),
    }


def webhook_slow_target(_shared: Server) -> dict[str, Any]:
    with _wh_server() as (server, _), _WhReceiver() as rec:
        a = httpx.Client(base_url=server.url, headers=A, timeout=60)
        b = httpx.Client(base_url=server.url, headers=B, timeout=60)
        with a, b:
            alone = _during(server, lambda: _wh_tenant_b(b, rec, "alone", 40))

            def slow() -> dict[str, Any]:
                a.put("/v1/default/banks/a-slow", json={}).raise_for_status()
                for i in range(4):
                    hook = {"url": f"{rec.url}/drip/{i}", "http_config": {"timeout_seconds": 60}}
                    a.post("/v1/default/banks/a-slow/webhooks", json=hook).raise_for_status()
                for i in range(10):
                    a.post(
                        "/v1/default/banks/a-slow/memories",
                        json={"items": [{"content": f"Ada's note {i}."}], "async": True},
                    ).raise_for_status()
                _wh_wait(lambda: rec.dripping >= 8, 60)  # A holds its share (or all of them)
                measured = _wh_tenant_b(b, rec, "beside-slow", 40)
                return {
                    **measured,
                    "a_deliveries_queued": 80,
                    "a_sends_at_once_max": rec.most_dripping,
                    "a_sends_dripping_at_end": rec.dripping,
                }

            beside = _during(server, slow)
    stuck = "b_not_delivered_within_s" in beside
    increase = None if stuck else beside["b_delivery_p99_ms"] - alone["b_delivery_p99_ms"]
    return {
        "b_alone": alone,
        "b_beside_slow_target": beside,
        "b_delivery_p99_increase_ms": None if increase is None else round(increase, 1),
        "b_unaffected_within_50ms": increase is not None and increase <= TARGET_STALL_MS,
        "health_max_ms": max(alone["health_max_ms"], beside["health_max_ms"]),
    }


def _wh_table_bytes(data_dir: str) -> dict[str, int]:
    """Bytes of each webhook table and its indexes in the server's SQLite file (dbstat)."""
    import sqlite3

    uri = f"file:{data_dir}/heed.db?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        rows = conn.execute(
            "SELECT m.tbl_name, SUM(s.pgsize) FROM dbstat s JOIN sqlite_master m"
            " ON m.name = s.name WHERE m.tbl_name LIKE 'webhook%' GROUP BY m.tbl_name"
        ).fetchall()
    return {str(name): int(size) for name, size in rows}


def _wh_bodies(data_dir: str, operation: str) -> dict[str, int]:
    """How many bodies the run's events are stored as, and their bytes (events stored once;
    before issue 37, one body per delivery)."""
    import sqlite3

    uri = f"file:{data_dir}/heed.db?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        try:
            sql = "SELECT COUNT(*), SUM(LENGTH(body)) FROM webhook_events WHERE id LIKE ?"
            n, size = conn.execute(sql, (f"{operation}:%",)).fetchone()
        except sqlite3.OperationalError:  # a body per delivery
            sql = "SELECT COUNT(*), SUM(LENGTH(body)) FROM webhook_deliveries WHERE event_id LIKE ?"
            n, size = conn.execute(sql, (f"{operation}:%",)).fetchone()
    return {"bodies_stored": int(n or 0), "body_bytes_stored": int(size or 0)}


def _wh_db_bytes(data_dir: str) -> int:
    from pathlib import Path

    return sum(p.stat().st_size for p in Path(data_dir).glob("heed.db*"))


def _wh_health_child(url: str, stop: Any, out: Any) -> None:
    samples: list[tuple[float, float]] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            at, started = time.time(), time.perf_counter()
            with contextlib.suppress(httpx.HTTPError):
                client.get("/health")
                samples.append((at, (time.perf_counter() - started) * 1000))
            stop.wait(0.01)
    out.send(samples)


class _WhHealth:
    """/health every 10 ms from a process of its own (the receivers in this one do not
    delay it), each answer's (wall-clock start, latency in ms)."""

    def __init__(self, url: str) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.samples: list[tuple[float, float]] = []
        self._stop = context.Event()
        self._out, child_end = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_wh_health_child, args=(url, self._stop, child_end), daemon=True
        )

    def __enter__(self) -> _WhHealth:
        self._process.start()
        _wh_wait(lambda: self._process.is_alive(), 30)
        time.sleep(1.0)  # the child's imports
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.samples = self._out.recv()
        self._process.join()

    def between(self, start: float, end: float) -> list[float]:
        return [ms for at, ms in self.samples if start <= at < end]


def webhook_fanout(_shared: Server) -> dict[str, Any]:
    """The big retain's events, then five small retains' (more fan-outs to measure /health
    and B's writes beside; each event goes to every webhook)."""
    with _wh_server() as (server, data_dir), _WhReceiver() as rec:
        a = httpx.Client(base_url=server.url, headers=A, timeout=300)
        b = httpx.Client(base_url=server.url, headers=B, timeout=60)
        with a, b:
            a.put("/v1/default/banks/fan", json={}).raise_for_status()
            statuses: dict[int, int] = {}
            for i in range(101):
                status = a.post("/v1/default/banks/fan/webhooks", json={"url": f"{rec.url}/f/{i}"})
                statuses[status.status_code] = statuses.get(status.status_code, 0) + 1
            refusal = status.json().get("detail")
            hooks = statuses.get(201, 0)
            b.put("/v1/default/banks/b-writes", json={}).raise_for_status()
            items = [
                {"content": f"Doc {i}: " + "Otto keeps a tidy ledger. " * 17} for i in range(2_000)
            ]
            big = json.dumps({"items": items, "async": True}).encode()
            small = json.dumps({"items": [{"content": "Otto's ledger balances."}], "async": True})
            tables_before = _wh_table_bytes(data_dir)
            db_before = _wh_db_bytes(data_dir)
            writes: list[tuple[float, float]] = []  # B's: (wall-clock start, ms)
            windows: list[tuple[float, float]] = []  # each event's: run end, last arrival

            def write(n: int) -> None:
                at, started = time.time(), time.perf_counter()
                b.put("/v1/default/banks/b-writes", json={"mission": f"write {n}"})
                writes.append((at, (time.perf_counter() - started) * 1000))
                time.sleep(0.02)

            def retain(body: bytes | str, n: int) -> tuple[str, int]:
                seen = len(rec.at("/f/"))
                operation = a.post(
                    "/v1/default/banks/fan/memories",
                    content=body,
                    headers={"Content-Type": "application/json"},
                ).json()["operation_id"]
                began = time.time()
                while len(rec.at("/f/")) < seen + 2 * hooks:
                    write(n := n + 1)
                    if time.time() - began > 1800:
                        raise SystemExit("webhook_fanout: the deliveries never all arrived")
                mine = rec.at("/f/")[seen:]
                windows.append((min(_wh_finished_at(x[2]) for x in mine), max(x[1] for x in mine)))
                return operation, n

            cpu_before = server.cpu_seconds()
            with _WhHealth(server.url) as health:
                idle_from = time.time()
                n = 0
                while time.time() - idle_from < 3:
                    write(n := n + 1)
                posted = time.time()
                operation, n = retain(big, n)
                big_arrivals = rec.at("/f/")
                for _ in range(5):
                    time.sleep(0.5)
                    _, n = retain(small, n)
                time.sleep(0.3)
            time.sleep(0.5)
            tables_after = _wh_table_bytes(data_dir)
            stored = _wh_bodies(data_dir, operation)
            db_growth = _wh_db_bytes(data_dir) - db_before
            cpu = server.cpu_seconds() - cpu_before

    def within(samples: list[tuple[float, float]]) -> list[float]:
        return [ms for at, ms in samples if any(s <= at < e for s, e in windows)]

    fanned = within(health.samples)
    ended, last = windows[0]
    grown = sum(tables_after.values()) - sum(tables_before.values())
    return {
        "webhook_create_statuses": {str(k): v for k, v in sorted(statuses.items())},
        "the_101st_refused_with": refusal,
        "webhooks": hooks,
        "retain_body_bytes": len(big),
        "retain_seconds": round(ended - posted, 2),
        "deliveries_received_for_the_big_retain": len(big_arrivals),
        "bytes_sent_for_the_big_retain": sum(len(x[2]) for x in big_arrivals),
        "largest_body_bytes": max(len(x[2]) for x in big_arrivals),
        "all_delivered_after_run_end_s": round(last - ended, 2),
        "events_measured": len(windows),
        "delivered_after_run_end_s_each": [round(e - s, 2) for s, e in windows],
        **stored,
        "webhook_tables_growth_bytes": grown,
        "webhook_bytes_stored_per_event": round(grown / (2 * len(windows))),
        "database_growth_bytes_memories_included": db_growth,
        "server_cpu_seconds": round(cpu, 2),
        **_wh_stats([ms for at, ms in writes if idle_from <= at < posted], "b_write_idle"),
        **_wh_stats(health.between(idle_from, posted), "health_idle"),
        **_wh_stats([ms for at, ms in writes if posted <= at < ended], "b_write_retain_runs"),
        **_wh_stats(health.between(posted, ended), "health_retain_runs"),
        **_wh_stats(within(writes), "b_write_fan_out_and_sends"),
        **_wh_stats(fanned, "health_fan_out_and_sends"),
        # The target: /health while the events fan out and are sent.
        "health_max_ms": round(max(fanned or [0.0]), 2),
    }


SCENARIOS: dict[str, Callable[[Server], dict[str, Any]]] = {
    "tags_60000": tags_60000,
    "retain_1000_items_64_tags": retain_1000_items,
    "header_150mb": header_150mb,
    "idle_1100": idle_1100,
    "stalled_bodies": stalled_bodies,
    "run_listing": run_listing,
    "queued_turns": queued_turns,
    "idle_streams": idle_streams,
    "file_bombs": file_bombs,
    "file_parse_cancel": file_parse_cancel,
    "archive_check_memory": archive_check_memory,
    "upload_spool": upload_spool,
    "background_fairness": background_fairness,
    "export_quota": export_quota,
    "webhook_slow_target": webhook_slow_target,
    "webhook_fanout": webhook_fanout,
    "key_guessing": key_guessing,  # last: it throttles this address for a minute
}


@contextlib.contextmanager
def _server() -> Iterator[Server]:
    env = {**scripted_env(0.05), "HEED_API_KEYS": f"{KEY_A}=a,{KEY_B}=b"}
    with tempfile.TemporaryDirectory(prefix="heed-abuse-") as data_dir, serve(data_dir, env) as s:
        yield s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", nargs="*", choices=sorted(SCENARIOS), help="run these scenarios only"
    )
    parser.add_argument("--name", default="abusive_inputs", help="results file name")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with _server() as server:
        for name, scenario in SCENARIOS.items():
            if args.only and name not in args.only:
                continue
            results[name] = scenario(server)
            print(f"{name}: {json.dumps(results[name])}")
    stalls = {name: r["health_max_ms"] for name, r in results.items() if r.get("health_max_ms")}
    targets = [
        {
            "target": f"/health never stalled more than {TARGET_STALL_MS:g} ms ({name})",
            "measured_ms": ms,
            "ok": ms <= TARGET_STALL_MS,
        }
        for name, ms in stalls.items()
    ]
    for name, r in results.items():
        if r.get("b_during_retain_p99_ms") is not None and r.get("b_idle_retain_p99_ms"):
            slower = r["b_during_retain_p99_ms"] - r["b_idle_retain_p99_ms"]
            targets.append(
                {
                    "target": f"tenant B's retain p99 no more than {TARGET_STALL_MS:g} ms "
                    f"slower than idle ({name})",
                    "measured_ms": round(slower, 2),
                    "ok": slower <= TARGET_STALL_MS,
                }
            )
    path = write_result(args.name, {"scenarios": results, "targets": targets})
    for target in targets:
        print(("PASS " if target["ok"] else "FAIL ") + target["target"], target["measured_ms"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
