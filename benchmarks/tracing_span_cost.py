"""CPU time of one recall's tracing alone, in process: the spans a recall makes, without the
recall (tracing_overhead.py measures them inside real recalls, which a loaded machine blurs).

An ASGI app makes what a recall makes for tracing: the route's ``name_request_span``, the
``search_memory`` span with its admission attribute and closing attributes, the
``embeddings``, ``recall.arm.semantic``, ``recall.arm.keyword`` and ``recall.rerank`` spans
with theirs, a 200 response; served bare (tracing off) and behind heed's request-span
middleware (tracing on, spans counted by an in-memory exporter behind ``--processor``'s span
processor). Reports the process CPU time a request takes, the minimum and median over
repeated blocks, and their difference: what tracing adds to a recall's CPU in a hot loop (a
real server, its caches cold from the recall's own work, pays more: see docs/performance.md).

Run it with ``PYTHONPATH`` pointing at any checkout's ``src``: it uses that checkout's
request spans (``heed.api.tracing.request_spans``) and span helpers, and sets attributes one
call each where that checkout's recall did (before issue 41's profile) or in one call.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Span

from _server import write_result
from heed.api import tracing as api_tracing
from heed.memory.spans import annotate, memory_span, stage_span
from heed.runtime import tracing

#: heed's own request spans and one-call attributes came together (issue 41, part 4).
ONE_CALL_ATTRIBUTES = hasattr(api_tracing, "RequestSpans")
ROUTE = "/v1/{tenant}/banks/{bank_id}/memories/recall"
PATH = "/v1/default/banks/bench-11600/memories/recall"


class _Count(SpanExporter):
    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Any) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS


def _set(span: Span, attributes: dict[str, Any]) -> None:
    if ONE_CALL_ATTRIBUTES:
        span.set_attributes(attributes)
    else:
        for key, value in attributes.items():
            span.set_attribute(key, value)


async def _recall_like(scope: Any, receive: Any, send: Any) -> None:
    api_tracing.name_request_span("POST", ROUTE)
    with memory_span("search_memory", "bench-11600", query="what pets") as search:
        annotate("heed.recall.admission_ms", 0.12)
        with stage_span("embeddings") as current:
            if current.is_recording():
                _set(
                    current,
                    {
                        "gen_ai.operation.name": "embeddings",
                        "gen_ai.embeddings.dimension.count": 384,
                    },
                )
        for arm in ("recall.arm.semantic", "recall.arm.keyword"):
            with stage_span(arm) as current:
                if current.is_recording():
                    current.set_attribute("heed.recall.candidates", 60)
        with stage_span("recall.rerank") as current:
            if current.is_recording():
                _set(current, {"heed.recall.candidates": 80, "heed.recall.reranker": "blend"})
        if search.is_recording():
            _set(
                search,
                {
                    "gen_ai.memory.records": 10,
                    "heed.recall.budget": "mid",
                    "heed.recall.background": False,
                },
            )
    headers = [(b"content-type", b"application/json"), (b"content-length", b"1000")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"x" * 1000})


SCOPE = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": PATH,
    "raw_path": PATH.encode(),
    "query_string": b"",
    "root_path": "",
    "server": ("127.0.0.1", 8000),
    "client": ("127.0.0.1", 50000),
    "headers": [
        (b"host", b"127.0.0.1:8000"),
        (b"accept", b"*/*"),
        (b"accept-encoding", b"gzip, deflate"),
        (b"connection", b"keep-alive"),
        (b"user-agent", b"python-httpx/0.28.1"),
        (b"content-length", b"30"),
        (b"content-type", b"application/json"),
    ],
}


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"{}", "more_body": False}


async def _send(message: Any) -> None:
    return None


async def _block(app: Any, n: int) -> float:
    """CPU microseconds a request, over *n* requests."""
    started = time.process_time()
    for _ in range(n):
        await app(dict(SCOPE), _receive, _send)
    return (time.process_time() - started) / n * 1e6


async def _measure(processor: str, blocks: int, per_block: int) -> dict[str, Any]:
    tracing.configure_tracing(False)
    off = [await _block(_recall_like, per_block) for _ in range(blocks)]
    state = tracing.configure_tracing(True, exporters=[])
    exporter = _Count()
    assert isinstance(state.tracer_provider, TracerProvider)
    kind = BatchSpanProcessor if processor == "batch" else SimpleSpanProcessor
    state.tracer_provider.add_span_processor(kind(exporter))
    app = api_tracing.request_spans(_recall_like, state)
    on = [await _block(app, per_block) for _ in range(blocks)]
    tracing.shutdown_tracing(state)
    return {
        "processor": processor,
        "spans_per_request": round(exporter.count / (blocks * per_block), 1),
        "off_us": {"min": round(min(off), 1), "median": round(statistics.median(off), 1)},
        "on_us": {"min": round(min(on), 1), "median": round(statistics.median(on), 1)},
        "tracing_us_per_recall": round(min(on) - min(off), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--blocks", type=int, default=15, help="repeated blocks (min taken)")
    parser.add_argument("--per-block", type=int, default=300, help="requests a block")
    parser.add_argument("--name", default="tracing_span_cost", help="results file name")
    args = parser.parse_args()
    out: dict[str, Any] = {
        "code": "issue 41 part 4 (own request spans)" if ONE_CALL_ATTRIBUTES else "before",
        "runs": [],
    }
    for processor in ("simple", "batch", "simple", "batch"):
        run = asyncio.run(_measure(processor, args.blocks, args.per_block))
        print(run)
        out["runs"].append(run)
    print("wrote", write_result(args.name, out))


if __name__ == "__main__":
    main()
