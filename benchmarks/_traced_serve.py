"""``heed serve`` whose spans go to an in-memory counting exporter (tracing_overhead.py).

Serves exactly as ``heed serve`` does (settings from ``HEED_*``, the switch interval, the
SIGTERM drain), except that with ``HEED_TRACING=on`` the spans are counted in memory instead
of being sent anywhere: the benchmark measures what making them costs, not a collector's
network. The exporter sits behind the span processor ``$BENCH_SPAN_PROCESSOR`` names:
``batch`` (the default; the ``BatchSpanProcessor`` heed puts every ``OTEL_TRACES_EXPORTER``
exporter behind, so what a deployment runs) or ``simple`` (the ``SimpleSpanProcessor`` heed
gives exporters passed in code, the tests' in-memory one: export on the span's own thread).
As it stops it writes how many spans it kept to ``$BENCH_SPAN_COUNT_FILE`` (when set).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from heed.api.app import create_app
from heed.api.server import HeedServer, server_config
from heed.logs import configure_logging
from heed.services import Services
from heed.settings import load_settings


class CountingExporter(SpanExporter):
    """An in-memory exporter that keeps a count, not the spans, and writes the count to
    *count_file* when the server's tracing shuts down (at the end of its lifespan: uvicorn
    then re-raises SIGTERM, so nothing after ``run()`` would run).

    Not the SDK's ``InMemorySpanExporter``, which keeps every span: a real exporter lets go
    of a span once sent, and 20,000 kept spans (about 11 objects each) make each full pass
    of the garbage collector cost more than the spans themselves (measured: 127 ms a pass
    with 24,000 spans kept, 11 ms without), which is not what tracing costs a server."""

    def __init__(self, count_file: str | None) -> None:
        self.count_file = count_file
        self.count = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            self.count += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if self.count_file:
            Path(self.count_file).write_text(str(self.count))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    settings = load_settings(port=args.port, log_level=args.log_level)
    configure_logging(settings.log_level)
    sys.setswitchinterval(settings.switch_interval_ms / 1000)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    exporter = CountingExporter(os.environ.get("BENCH_SPAN_COUNT_FILE"))
    processor = os.environ.get("BENCH_SPAN_PROCESSOR", "batch")
    if processor not in ("batch", "simple"):
        raise SystemExit(f"BENCH_SPAN_PROCESSOR must be batch or simple, not {processor!r}")
    # simple: heed puts an exporter passed in code behind a SimpleSpanProcessor; batch: no
    # exporter passed, the counting one added behind a BatchSpanProcessor, as
    # heed.runtime.tracing.configure_tracing does for OTEL_TRACES_EXPORTER's.
    services = Services(settings, span_exporters=[exporter] if processor == "simple" else [])
    provider = services.tracing.tracer_provider
    if processor == "batch" and isinstance(provider, TracerProvider):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    app = create_app(settings, services)
    HeedServer(server_config(app, settings), app).run()


if __name__ == "__main__":
    main()
