"""Reconnect chaos: random disconnects and resumes during a long streamed turn.

Starts ``heed serve`` (scripted echo provider), starts one turn of ``--tokens``
words, and has ``--clients`` readers follow its stream. Each reader drops its
connection after a random number of events (and sometimes after a random pause)
and resumes from the last seq it saw -- half of the resumes with
``Last-Event-ID``, half with ``?after=`` -- until ``--disconnects`` drops have
happened in total, then reads to the terminal event.

Each reader rebuilds the answer from its ``token`` events. Counts events lost
(a seq skipped) and duplicated (a seq seen twice), and checks every rebuilt
text equals the assistant message stored in the transcript. Target: zero lost,
zero duplicated. Writes ``benchmarks/results/reconnect_chaos.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx

from _server import scripted_env, serve, write_result
from _sse import raw_sse

TERMINAL = ("completed", "cancelled", "failed", "interrupted")


@dataclass
class Budget:
    left: int


@dataclass
class Reader:
    last_seq: int = 0
    text: list[str] = field(default_factory=list)
    lost: int = 0
    duplicated: int = 0
    connections: int = 0
    disconnects: int = 0
    done: bool = False


async def follow(
    host: str, port: int, run_id: str, budget: Budget, rng: random.Random, mean_events: int
) -> Reader:
    reader = Reader()
    while not reader.done:
        reader.connections += 1
        use_header = rng.random() < 0.5
        path = f"/v1/runs/{run_id}/stream"
        headers: dict[str, str] = {}
        if use_header:
            headers["Last-Event-ID"] = str(reader.last_seq)
        else:
            path += f"?after={reader.last_seq}"
        drop_after = rng.randint(1, 2 * mean_events) if budget.left > 0 else None
        seen = 0
        async for event_id, event, data in raw_sse(host, port, path, headers):
            if event_id is None:
                continue
            seq = int(event_id)
            if seq <= reader.last_seq:
                reader.duplicated += 1
                continue
            if seq != reader.last_seq + 1:
                reader.lost += seq - reader.last_seq - 1
            reader.last_seq = seq
            if event == "text_delta":
                reader.text.append(json.loads(data)["data"]["text"])
            if event in TERMINAL:
                reader.done = True
                break
            seen += 1
            if drop_after is not None and seen >= drop_after and budget.left > 0:
                budget.left -= 1
                reader.disconnects += 1
                break  # closes the socket mid-stream
        if not reader.done and rng.random() < 0.3:
            await asyncio.sleep(rng.uniform(0, 0.2))  # stay away a while: resume from replay
    return reader


async def main_async(args: argparse.Namespace, base: str) -> dict[str, object]:
    url = urlparse(base)
    host, port = url.hostname or "127.0.0.1", int(url.port or 80)
    words = " ".join(f"w{i}" for i in range(args.tokens))
    rng = random.Random(args.seed)
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        sid = (await client.post("/v1/sessions", json={"title": "chaos"})).json()["id"]
        run_id = (await client.post(f"/v1/sessions/{sid}/turns", json={"content": words})).json()[
            "run_id"
        ]
        budget = Budget(args.disconnects)
        # roughly spread the drops over the whole turn
        mean_events = max(1, int(0.6 * args.tokens * args.clients / max(1, args.disconnects)))
        started = time.monotonic()
        readers = await asyncio.gather(
            *(
                follow(host, port, run_id, budget, random.Random(rng.random()), mean_events)
                for _ in range(args.clients)
            )
        )
        elapsed = time.monotonic() - started
        messages = (await client.get(f"/v1/sessions/{sid}")).json()["messages"]
        stored = messages[-1]["content"]
    lost = sum(r.lost for r in readers)
    duplicated = sum(r.duplicated for r in readers)
    texts_equal = all("".join(r.text) == stored for r in readers)
    return {
        "tokens": args.tokens,
        "clients": args.clients,
        "disconnects": sum(r.disconnects for r in readers),
        "connections": sum(r.connections for r in readers),
        "events_lost": lost,
        "events_duplicated": duplicated,
        "every_rebuilt_text_equals_stored_message": texts_equal,
        "stored_message_chars": len(stored),
        "elapsed_s": round(elapsed, 2),
        "target": "zero lost, zero duplicated",
        "target_met": lost == 0 and duplicated == 0 and texts_equal and stored == words,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--disconnects", type=int, default=200)
    parser.add_argument("--token-delay", type=float, default=0.004)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as data_dir,
        serve(data_dir, scripted_env(args.token_delay)) as server,
    ):
        result = asyncio.run(main_async(args, server.url))
    print(
        f"{result['disconnects']} disconnects over {result['connections']} connections by "
        f"{result['clients']} clients during a {result['tokens']}-token turn: "
        f"{result['events_lost']} lost, {result['events_duplicated']} duplicated; rebuilt text "
        f"equals stored message: {result['every_rebuilt_text_equals_stored_message']} "
        f"(target: zero lost, zero duplicated)"
    )
    print("wrote", write_result("reconnect_chaos", result))


if __name__ == "__main__":
    main()
