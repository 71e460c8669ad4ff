"""Property tests for what a client puts in a URL: SSE resume cursors and object ids.

One real server for the module (loopback, no keys, scripted LLM). Hypothesis generates the
values; the number of examples is bounded and the runs are derandomized, so CI sees the same
cases every time and the file runs in seconds.

**Cursors** (``GET /v1/runs/{id}/stream`` with ``?after=`` and/or ``Last-Event-ID``), against a
finished run so every stream must end. The contract (``docs/security.md``, ``heed.api.sse``):

- a cursor is a decimal number (ASCII digits; surrounding whitespace is ignored); the stream
  replays every event after it, each exactly once, and ends after the terminal event;
- blank (empty or only whitespace) means "not given": ``Last-Event-ID`` is used, else 0;
- negative or malformed (anything else) means 0: the whole journal;
- huge (past the journal, 2**63, 10**30, more than 19 digits) means "after everything": the
  stream ends at once with no event, never an overflow, never a 500;
- ``?after=`` wins over ``Last-Event-ID``.

:func:`expected_start` states it independently of the server's parser.

**Ids** (bank, document, session, run, operation and memory ids) that are very long (past
``MAX_ID_CHARS``), unicode, with slashes, percent-encoded (sent escaped, and sent raw so the
server decodes the escapes), with control characters: every route that takes one answers a 4xx
naming the problem (422 naming the parameter for a value past its limit, 404 naming the id
otherwise), never a 5xx, and nothing is created. Document ids are chosen by clients: whatever
retain accepts (any text up to 512 characters) can be read back under the same id and deleted;
what it refuses is a 422 naming ``document_id``.

Two regressions are pinned by examples at the end: number lookalikes (``1_0``, ``+3``,
non-ASCII digits) are malformed cursors, not numbers; and an id ending in ``/`` is a 404, never
a redirect (307) to the id without it, which a client would follow to another object.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from heed.api.app import create_app
from heed.api.input_rules import MAX_ID_CHARS
from heed.settings import Settings
from tests.support import LiveServer, live_server, wait_for

BOUNDED = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FEWER = settings(BOUNDED, max_examples=30)
"""For the properties that cost a retain (an embedding) per example."""

BANK = "props-bank"
KNOWN_DOC = "known/doc-1"
TURN_WORDS = "one two three four five six seven eight"
TERMINAL = {"completed", "failed", "cancelled", "interrupted"}
MAX_CURSOR = 2**62  # documented: anything above is clamped
ASCII_SPACE = " \t\r\n\x0b\x0c"


# -- the server, one finished run, one bank -----------------------------------------------------


@dataclass
class World:
    server: LiveServer
    client: httpx.Client
    run_id: str
    journal: list[tuple[int, str, dict[str, Any]]]
    """The finished run's whole journal: (seq, event type, data)."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    settings_ = Settings(
        data_dir=tmp_path_factory.mktemp("props"),
        llm_provider="scripted",
        llm_script=json.dumps({"token_delay": 0, "replies": []}),  # echo, at once
        stream_heartbeat_seconds=0.5,
        stream_poll_seconds=0.2,
    )
    with (
        live_server(create_app(settings_)) as server,
        httpx.Client(base_url=server.url, timeout=httpx.Timeout(10, read=5)) as client,
    ):
        assert client.put(f"/v1/default/banks/{BANK}", json={}).status_code == 200
        retained = client.post(
            f"/v1/default/banks/{BANK}/memories",
            json={"items": [{"content": "Alice likes tea.", "document_id": KNOWN_DOC}]},
        )
        assert retained.status_code == 200, retained.text
        session = client.post("/v1/sessions", json={"title": "props"}).json()["id"]
        turn = client.post(f"/v1/sessions/{session}/turns", json={"content": TURN_WORDS})
        assert turn.status_code == 202, turn.text
        run_id = turn.json()["run_id"]
        wait_for(lambda: client.get(f"/v1/runs/{run_id}").json()["phase"] == "completed", 20)
        status, frames = _stream(client, run_id)
        assert status == 200
        assert [seq for seq, _, _ in frames] == list(range(1, len(frames) + 1))
        assert frames[-1][1] == "completed" and len(frames) >= len(TURN_WORDS.split()) + 3
        yield World(server, client, run_id, frames)


def _parse_sse(text: str) -> list[tuple[int, str, dict[str, Any]]]:
    """Frames with an id; any frame without one (a ``gap``) or an unparsable one fails."""
    assert text.startswith("retry: "), text[:200]
    frames = []
    for block in text.split("\n\n")[1:]:
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        fields = dict(line.split(": ", 1) for line in lines)
        assert set(fields) == {"id", "event", "data"}, block
        frames.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
    return frames


def _stream(
    client: httpx.Client,
    run_id: str,
    after: str | None = None,
    last_event_id: bytes | None = None,
) -> tuple[int, list[tuple[int, str, dict[str, Any]]]]:
    """Read the run's stream to its end (a read timeout, i.e. a stream that does not end, fails
    the test); the status and the frames."""
    params = {"after": after} if after is not None else {}
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    with client.stream(
        "GET", f"/v1/runs/{run_id}/stream", params=params, headers=headers
    ) as response:
        body = response.read().decode()
    if response.status_code != 200:
        return response.status_code, []
    assert response.headers["content-type"].startswith("text/event-stream")
    return 200, _parse_sse(body)


# -- cursors -------------------------------------------------------------------------------------


def _cursor_of(raw: str | None) -> int | None:
    """One cursor source by the contract: None when blank or absent, else where it starts."""
    if raw is None:
        return None
    text = raw.strip(ASCII_SPACE)
    if not text:
        return None
    if re.fullmatch(r"[0-9]+", text):
        return MAX_CURSOR if len(text) > 19 else min(MAX_CURSOR, int(text))
    return 0  # negative or malformed


def expected_start(after: str | None, last_event_id: str | None) -> int:
    """The seq the stream resumes after, by the contract in the module docstring."""
    for raw in (after, last_event_id):
        cursor = _cursor_of(raw)
        if cursor is not None:
            return cursor
    return 0


def _check_replay(world: World, status: int, frames: list[Any], start: int) -> None:
    assert status == 200
    expected = [f for f in world.journal if f[0] > start]
    assert [f[0] for f in frames] == [f[0] for f in expected], f"resumed after {start}"
    assert frames == expected  # the same events, each exactly once, in order
    if frames:
        assert frames[-1][1] in TERMINAL  # ...and it ends after the terminal event
        assert not [f for f in frames[:-1] if f[1] in TERMINAL]


_NUMBERS = st.one_of(
    st.integers(min_value=-3, max_value=20),  # around the journal (about a dozen events)
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([2**31, 2**62, 2**62 + 1, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63)]),
).map(str)
# Number lookalikes included: non-ASCII digits and spaces, "_", "+" (Python's int() reads
# them all as numbers; a cursor is ASCII digits only).
_ANY_CHARACTER = st.characters(exclude_categories=("Cs",))
_MALFORMED = st.text(
    alphabet=st.one_of(_ANY_CHARACTER, st.sampled_from("0123456789-.e _+\u0663\uff13\u2003")),
    min_size=1,
    max_size=30,
)
_WHITESPACE = st.text(alphabet=st.sampled_from(ASCII_SPACE), max_size=4)
QUERY_CURSORS = st.one_of(
    _NUMBERS,
    st.tuples(_WHITESPACE, _NUMBERS, _WHITESPACE).map("".join),
    _MALFORMED,
    _WHITESPACE,
    st.just("9" * 400),
)
HEADER_CURSORS = st.one_of(
    _NUMBERS,
    # Any text a header can carry (no control characters, nothing blank at either end), sent
    # as UTF-8; the server reads header bytes as latin-1, so non-ASCII is never a number.
    st.text(
        alphabet=st.characters(exclude_categories=("Cs", "Cc"), exclude_characters="_+"),
        min_size=1,
        max_size=30,
    ).map(lambda s: s.strip(" \t")),
    st.just(""),
).map(lambda s: s.encode("utf-8"))


@BOUNDED
@given(after=QUERY_CURSORS)
@example(after="-1")
@example(after="-0")
@example(after="")
@example(after=" ")
@example(after="nine")
@example(after="é")
@example(after="3.0")
@example(after="1e3")
@example(after="0x3")
@example(after="3")
@example(after=" 3\t")
@example(after=str(2**63))
@example(after=str(10**30))
@example(after="9" * 19)
def test_after_cursor_replays_from_the_right_place(world: World, after: str) -> None:
    status, frames = _stream(world.client, world.run_id, after=after)
    _check_replay(world, status, frames, expected_start(after, None))


@BOUNDED
@given(last_event_id=HEADER_CURSORS)
@example(last_event_id=b"-5")
@example(last_event_id=b"nine")
@example(last_event_id=b"")
@example(last_event_id=b"4")
@example(last_event_id=str(2**63).encode())
@example(last_event_id=str(10**30).encode())
@example(last_event_id="\u00e9\u00e8".encode())
@example(last_event_id="\u0663".encode())  # ARABIC-INDIC DIGIT THREE, as UTF-8 bytes
@example(last_event_id=b"\xff\xfe")
def test_last_event_id_replays_from_the_right_place(world: World, last_event_id: bytes) -> None:
    status, frames = _stream(world.client, world.run_id, last_event_id=last_event_id)
    _check_replay(world, status, frames, expected_start(None, last_event_id.decode("latin-1")))


@BOUNDED
@given(after=QUERY_CURSORS, last_event_id=HEADER_CURSORS)
@example(after="", last_event_id=b"5")
@example(after="  ", last_event_id=b"5")
@example(after="2", last_event_id=b"5")
@example(after="x", last_event_id=b"5")
@example(after=str(10**30), last_event_id=b"1")
def test_after_wins_over_last_event_id_unless_blank(
    world: World, after: str, last_event_id: bytes
) -> None:
    status, frames = _stream(world.client, world.run_id, after, last_event_id)
    start = expected_start(after, last_event_id.decode("latin-1"))
    _check_replay(world, status, frames, start)


@pytest.mark.parametrize("raw", ["3", "-1", "zz", str(2**63)])
def test_a_cursor_on_an_unknown_run_is_a_404(world: World, raw: str) -> None:
    status, _ = _stream(world.client, "run_does_not_exist", after=raw, last_event_id=raw.encode())
    assert status == 404


# -- ids -----------------------------------------------------------------------------------------


_TEXT = st.characters(exclude_categories=("Cs",))
_CONTROL = st.sampled_from([chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]])
_SEGMENT = st.text(alphabet=_TEXT, max_size=8)
BAD_IDS = st.one_of(
    # past the limit: 422 naming the parameter
    st.text(alphabet=st.sampled_from("abcdef0123"), min_size=MAX_ID_CHARS + 1, max_size=3000),
    st.text(alphabet=_TEXT, min_size=MAX_ID_CHARS + 1, max_size=MAX_ID_CHARS + 40),
    # unicode, at least one character outside ASCII
    st.text(alphabet=_TEXT, min_size=1, max_size=40).filter(lambda s: not s.isascii()),
    # with slashes
    st.lists(_SEGMENT, min_size=2, max_size=5).map("/".join),
    # percent escapes (valid, invalid, truncated, of "/" and NUL)
    st.lists(
        st.one_of(
            st.sampled_from(["%2F", "%2f", "%00", "%ff", "%C3%A9", "%", "%%", "%2", "%zz", "%25"]),
            st.text(alphabet=st.sampled_from("abc-"), min_size=1, max_size=3),
        ),
        min_size=1,
        max_size=6,
    ).map("".join),
    # control characters
    st.tuples(_SEGMENT, _CONTROL, _SEGMENT).map("".join),
    st.sampled_from([".", "..", "...", " ", "\t", "\n", "\r\n", "a/..", "../a", "%2e%2e"]),
)
"""Ids none of which names an object (and none is a valid new bank id: the bank id rule is
1-128 letters, digits, ``._:@-``, starting with a letter or digit)."""


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    body: Any = None


BANK_ROUTES = [
    Route("GET", "/v1/default/banks/{id}"),
    Route("PUT", "/v1/default/banks/{id}", {"name": "n"}),
    Route("PATCH", "/v1/default/banks/{id}", {"name": "n"}),
    Route("DELETE", "/v1/default/banks/{id}"),
    Route("GET", "/v1/default/banks/{id}/profile"),
    Route("GET", "/v1/default/banks/{id}/stats"),
    Route("POST", "/v1/default/banks/{id}/memories", {"items": [{"content": "x y"}]}),
    Route("POST", "/v1/default/banks/{id}/memories", {"async": True, "items": [{"content": "x"}]}),
    Route("POST", "/v1/default/banks/{id}/memories/recall", {"query": "tea"}),
    Route("GET", "/v1/default/banks/{id}/memories/list"),
    Route("GET", "/v1/default/banks/{id}/memories/m-1"),
    Route("GET", "/v1/default/banks/{id}/documents"),
    Route("GET", "/v1/default/banks/{id}/documents/" + KNOWN_DOC),
    Route("GET", "/v1/default/banks/{id}/operations"),
    Route("GET", "/v1/default/banks/{id}/operations/op-1"),
    Route("POST", "/v1/default/banks/{id}/reflect", {"query": "tea"}),
    Route("POST", "/v1/default/banks/{id}/reflect", {"query": "tea", "stream": True}),
]
SESSION_ROUTES = [
    Route("GET", "/v1/sessions/{id}"),
    Route("PATCH", "/v1/sessions/{id}", {"title": "t"}),
    Route("DELETE", "/v1/sessions/{id}"),
    Route("POST", "/v1/sessions/{id}/turns", {"content": "hi"}),
    Route("GET", "/v1/sessions/{id}/status"),
    Route("GET", "/v1/sessions/{id}/events"),
]
RUN_ROUTES = [
    Route("GET", "/v1/runs/{id}"),
    Route("POST", "/v1/runs/{id}/cancel"),
    Route("GET", "/v1/runs/{id}/stream"),
]
DOCUMENT_ROUTES = [
    Route("GET", f"/v1/default/banks/{BANK}/documents/{{id}}"),
    Route("DELETE", f"/v1/default/banks/{BANK}/documents/{{id}}"),
]
OPERATION_ROUTES = [
    Route("GET", f"/v1/default/banks/{BANK}/operations/{{id}}"),
    Route("DELETE", f"/v1/default/banks/{BANK}/operations/{{id}}"),
]
MEMORY_ROUTES = [
    Route("GET", f"/v1/default/banks/{BANK}/memories/{{id}}"),
    Route("DELETE", f"/v1/default/banks/{BANK}/memories/{{id}}"),
]


def _inventory(client: httpx.Client) -> dict[str, Any]:
    """What exists: banks, sessions, and the test bank's documents, units and operations."""
    bank = f"/v1/default/banks/{BANK}"
    return {
        "banks": client.get("/v1/default/banks").json()["total"],
        "sessions": sorted(s["id"] for s in client.get("/v1/sessions").json()["sessions"]),
        "documents": sorted(d["id"] for d in client.get(f"{bank}/documents").json()["items"]),
        "units": client.get(f"{bank}/memories/list").json()["total"],
        "operations": client.get(f"{bank}/operations").json()["total"],
    }


def _check_refused(response: httpx.Response, sent_id: str, where: str) -> None:
    """A 4xx naming the problem: an id past its limit is a 422 naming the path parameter, any
    other a 404 naming the id. An id holding ``/`` may match no route (the router's "Not
    Found") or one with other methods (405): the server splits the path before it decodes."""
    status, text = response.status_code, response.text
    assert status < 500, f"{where}: {status} {text[:300]}"
    routed = "/" not in sent_id
    allowed = {400, 404, 422} if routed else {400, 404, 405, 422}
    assert status in allowed, f"{where}: {status} {text[:300]}"
    assert response.headers["content-type"].startswith("application/json"), where
    detail = response.json()["detail"]
    if "\x00" in sent_id:  # NUL is refused at the edge, before any route (docs/security.md)
        assert status == 400 and "NUL" in detail, f"{where}: {status} {text[:300]}"
        return
    if routed and len(sent_id) > MAX_ID_CHARS:
        assert status == 422, f"{where}: {status} {text[:300]}"
    if status == 422:
        assert isinstance(detail, list) and detail, where
        assert any(e["loc"][0] == "path" for e in detail), f"{where}: {detail}"
    elif status == 404 and routed:
        assert isinstance(detail, str) and repr(sent_id) in detail, f"{where}: {detail!r}"
    else:
        assert isinstance(detail, str) and detail, where


def _send(client: httpx.Client, route: Route, url: str) -> httpx.Response:
    with client.stream(route.method, url, json=route.body) as response:
        response.read()  # a refusal is JSON; a stream here (a 200) fails the status check
        return response


def _try_every_route(world: World, routes: list[Route], bad_id: str) -> None:
    client = world.client
    before = _inventory(client)
    # Escaped: the server sees the id as written. Raw escapes: the server decodes them. Dots
    # are escaped too, or the client would resolve "." and ".." segments before sending.
    for escaped in (True, False):
        url_id = quote(bad_id, safe="" if escaped else "%").replace(".", "%2E")
        sent = bad_id if escaped else unquote(bad_id, errors="replace")
        for route in routes:
            url = route.template.replace("{id}", url_id)
            _check_refused(_send(client, route, url), sent, f"{route.method} {url[:120]}")
    assert _inventory(client) == before, "a refused request created or deleted something"


@BOUNDED
@given(bad_id=BAD_IDS)
@example(bad_id="x" * (MAX_ID_CHARS + 1))
@example(bad_id="\u00e9t\u00e9")
@example(bad_id="a/b")
@example(bad_id="a%2Fb")
@example(bad_id="%ff")
@example(bad_id="a\x00b")
@example(bad_id="a\nb")
@example(bad_id="abc\n")  # `$` in a Python re.match accepts a final newline
def test_bad_bank_ids_are_refused_on_every_bank_route(world: World, bad_id: str) -> None:
    _try_every_route(world, BANK_ROUTES, bad_id)


@BOUNDED
@given(bad_id=BAD_IDS)
@example(bad_id="ses_" + "0" * MAX_ID_CHARS)
@example(bad_id="ses_\u00e9")
@example(bad_id="ses/x")
@example(bad_id="x/status")
@example(bad_id="%00")
def test_bad_session_ids_are_refused(world: World, bad_id: str) -> None:
    _try_every_route(world, SESSION_ROUTES, bad_id)


@BOUNDED
@given(bad_id=BAD_IDS)
@example(bad_id="run_" + "0" * MAX_ID_CHARS)
@example(bad_id="run_\u00e9")
@example(bad_id="x/stream")
@example(bad_id="x/cancel")
@example(bad_id="run\x7f")
def test_bad_run_ids_are_refused(world: World, bad_id: str) -> None:
    _try_every_route(world, RUN_ROUTES, bad_id)


@BOUNDED
@given(bad_id=BAD_IDS)
@example(bad_id="op-" + "0" * MAX_ID_CHARS)
@example(bad_id="op/1")
@example(bad_id="\u0000")
def test_bad_operation_and_memory_ids_are_refused(world: World, bad_id: str) -> None:
    _try_every_route(world, [*OPERATION_ROUTES, *MEMORY_ROUTES], bad_id)


@BOUNDED
@given(bad_id=BAD_IDS)
@example(bad_id="d" * (MAX_ID_CHARS + 1))
@example(bad_id="known/doc-1/")
@example(bad_id="known/doc-1\n")
@example(bad_id="known%2Fdoc-2")
@example(bad_id="/")
def test_unknown_document_ids_are_404s_and_the_known_one_survives(
    world: World, bad_id: str
) -> None:
    _try_every_route(world, DOCUMENT_ROUTES, bad_id)
    assert KNOWN_DOC in _inventory(world.client)["documents"]


DOCUMENT_IDS = st.one_of(
    BAD_IDS,
    st.text(alphabet=_TEXT, min_size=1, max_size=MAX_ID_CHARS),
    st.sampled_from(["", "a\nb", "doc\n", "\n", "/", "//", "a//b", "dir/", "/abs", "%2F"]),
)


@FEWER
@given(document_id=DOCUMENT_IDS)
def test_any_document_id_retain_accepts_can_be_read_and_deleted(
    world: World, document_id: str
) -> None:
    assume(document_id != KNOWN_DOC)
    client, bank = world.client, f"/v1/default/banks/{BANK}"
    before = _inventory(client)
    r = client.post(
        f"{bank}/memories",
        json={"items": [{"content": "Bob likes coffee.", "document_id": document_id}]},
    )
    if "\x00" in document_id:  # NUL is refused at the edge (docs/security.md)
        assert r.status_code == 400 and "NUL" in r.json()["detail"], r.text
        assert _inventory(client) == before
        return
    if not 1 <= len(document_id) <= MAX_ID_CHARS:
        assert r.status_code == 422, r.text
        locs = [e["loc"] for e in r.json()["detail"]]
        assert ["body", "items", 0, "document_id"] in locs, locs
        assert _inventory(client) == before
        return
    assert r.status_code == 200, r.text
    assert r.json()["document_ids"] == [document_id]
    url = f"{bank}/documents/{quote(document_id, safe='').replace('.', '%2E')}"
    got = client.get(url)
    assert got.status_code == 200, f"written, then unreadable: {got.status_code} {got.text}"
    assert got.json()["id"] == document_id
    assert got.json()["original_text"] == "Bob likes coffee."
    deleted = client.delete(url)
    assert deleted.status_code == 200, f"written, then undeletable: {deleted.text}"
    assert deleted.json()["document_id"] == document_id
    assert client.get(url).status_code == 404
    assert _inventory(client) == before


def test_a_document_id_is_not_read_as_its_prefix(world: World) -> None:
    """``known/doc-1`` followed by a line feed is another (unknown) id, not ``known/doc-1``."""
    bank = f"/v1/default/banks/{BANK}"
    for suffix in ("%0A", "%0A%0A", "%0D%0A"):
        r = world.client.get(f"{bank}/documents/{quote(KNOWN_DOC, safe='')}{suffix}")
        assert r.status_code == 404, r.text
    assert world.client.get(f"{bank}/documents/{KNOWN_DOC}").status_code == 200


# -- regressions, pinned -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "last_event_id"),
    [
        ("1_0", None),
        ("+3", None),
        ("\u0663", None),  # ARABIC-INDIC DIGIT THREE
        ("\uff13", None),  # FULLWIDTH DIGIT THREE
        ("\u20033", None),  # EM SPACE, 3
        (None, b"1_0"),
        (None, b"+3"),
    ],
)
def test_number_lookalike_cursors_replay_the_whole_journal(
    world: World, after: str | None, last_event_id: bytes | None
) -> None:
    status, frames = _stream(world.client, world.run_id, after, last_event_id)
    _check_replay(world, status, frames, 0)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/sessions/abc%2F"),
        ("DELETE", "/v1/sessions/abc%2F"),
        ("GET", "/v1/runs/abc%2F"),
        ("GET", "/v1/default/banks/abc%2F"),
        ("DELETE", "/v1/default/banks/abc%2F"),
        ("GET", f"/v1/default/banks/{BANK}/memories/abc%2F"),
        ("DELETE", f"/v1/default/banks/{BANK}/operations/abc%2F"),
        ("GET", "/v1/sessions/%2F"),
    ],
)
def test_an_id_ending_in_a_slash_is_a_404_not_a_redirect(
    world: World, method: str, path: str
) -> None:
    r = world.client.request(method, path, follow_redirects=False)
    assert r.status_code == 404, (r.status_code, r.headers.get("location"))
