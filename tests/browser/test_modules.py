"""The UI's pure pieces, run in the browser: the SSE parser and the trace reader."""

from __future__ import annotations

import json
from typing import Any

from tests.support import LiveServer

PARSE = """async () => {
    const { SseParser } = await import('/ui/stream.js');
    const text = [
        'retry: 1000\\r\\n\\r\\n: heartbeat\\n\\n',
        'id: 7\\nevent: text_delta\\ndata: {"seq":7}\\n\\n',
        'event: gap\\r\\ndata: line one\\r\\ndata: line two\\r\\n\\r\\n',
        'id: 8\\ndata:no-space\\n\\n',
    ].join('');
    const results = [];
    // Every way of cutting the text into two chunks gives the same events.
    for (let cut = 0; cut <= text.length; cut++) {
        const parser = new SseParser();
        const events = [...parser.feed(text.slice(0, cut)), ...parser.feed(text.slice(cut))];
        results.push(JSON.stringify(events));
    }
    return results;
}"""

TRACE = """async () => {
    const { stageTimings } = await import('/ui/memory.js');
    return [
        stageTimings({ total_ms: 3, stages: [{ stage: 'embedding', ms: 2, candidates: 4 }] }),
        stageTimings({ timings_ms: { fusion: 1.5 } }),
        stageTimings(null),
    ];
}"""


def test_sse_parser_is_independent_of_chunk_boundaries(page: Any, server: LiveServer) -> None:
    page.goto(server.url + "/")
    results = page.evaluate(PARSE)
    assert len(set(results)) == 1, "the events depend on where the chunks were cut"
    events = json.loads(results[0])
    assert events == [
        {"event": "text_delta", "id": "7", "data": '{"seq":7}'},
        {"event": "gap", "id": None, "data": "line one\nline two"},
        {"event": "message", "id": "8", "data": "no-space"},
    ]


def test_stage_timings_read_from_a_recall_trace(page: Any, server: LiveServer) -> None:
    page.goto(server.url + "/")
    full, table, empty = page.evaluate(TRACE)
    assert full == [{"name": "embedding", "ms": 2, "count": 4}]
    assert table == [{"name": "fusion", "ms": 1.5}]
    assert empty == []
