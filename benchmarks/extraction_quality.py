"""Extraction quality: LoCoMo evidence recall through extracted facts' provenance.

Each conversation of the LoCoMo dev split is retained as ``locomo_recall.py`` does (one bank
per conversation, one document per session, one item per turn, the turn's ``dia_id`` in
metadata), into a real ``heed serve`` subprocess, once per variant:

- ``turns``: extraction off; the banks hold the verbatim turns only.
- ``oracle``: extraction on (``HEED_RETAIN_EXTRACTION=concise``) with the ``scripted``
  provider serving retain: a script answers each chunk's extraction call with that
  session's ``observation`` annotations from the data file (facts written by an LLM when
  LoCoMo was made, each citing its ``dia_id``s), the ones whose turns fall in the chunk,
  ``sources`` = those turns' numbers in the chunk's prompt. The script is built by replaying
  heed's own split and chunking (``heed.memory.retain.prepare.split_documents``,
  ``heed.memory.learning.extraction.chunk_units`` and ``facts_prompt``); each reply's ``when`` is
  the chunk's whole prompt, so a reply can only match its own chunk (checked). A fact whose
  turns span two chunks goes to the chunk of its first turn and cites only its turns there.
- ``local``: the embedded model (SmolLM2-135M) as extractor. First a live probe: a server
  with ``HEED_RETAIN_LLM_PROVIDER=local`` retains the scope's first session. When it
  survives, the variant runs live. When it does not (as of this writing the server dies
  with SIGSEGV: llama.cpp refuses the grammar built from the facts schema, and
  llama-cpp-python then samples through a null grammar), heed's extraction calls run in
  this process instead (the same prompts, schema, validation and re-ask, on the ``local``
  provider built from the same settings), with the grammar built from the schema without
  its ``maxLength`` / ``maxItems``, and the validated replies are replayed into the server
  by the scripted provider, the way the oracle's are. The JSON says which path ran. The
  model is slow on 2 cores, so this variant has its own, smaller scope
  (``--local-conversations`` / ``--local-sessions``), with ``turns`` and ``oracle`` run again
  on that same scope beside it.

Every question of categories 1-4 with evidence in the retained sessions is asked
(``POST .../memories/recall``, ``max_tokens`` 100,000) and scored by turn-level evidence
recall@5/10/20, overall and per category.

Scoring rule (how a ranked result counts as turns): a verbatim turn counts as its own
``dia_id``; a fact counts as the ``dia_id``s of the units in its provenance
(``source_fact_ids`` of the recall result, mapped to turns through ``memories/list``).

- ``results`` (the headline): recall@k = |evidence & turns of the top k *results*| /
  |evidence|; k counts results, whatever they are. A fact citing three turns brings three
  (and a fact citing no valid unit cites its whole chunk, about 20 turns: see
  ``sources_per_fact``).
- ``turn_budget``: the results' turns in rank order, deduplicated, cut to the first k
  *turns*: the same reading budget in turns as the verbatim ranking has.

For ``turns`` both rules give the same figure. Targets (issue 30): oracle recall@10 >= 0.85
on dev (turns alone measured 0.786 by ``locomo_recall.py``), multi-hop recall@10 >= 0.60.

The data is read from ../shared (CC BY-NC 4.0); it is never copied here. Extraction counts
(facts written, chunks that gave none) are read from the bank, since a retain's response
does not report what extraction did.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from _locomo import DEFAULT_DATA, Conversation, Turn, load_conversations
from _server import percentile, serve, write_result
from heed.llm.base import BadModelOutput, JsonSchemaFormat, ProviderError
from heed.llm.structured import complete_json
from heed.memory.learning.extraction import FACTS_SCHEMA, chunk_units, facts_prompt
from heed.memory.models import PreparedDocument, RetainItem
from heed.memory.retain.prepare import DocumentPlan, split_documents

KS = (5, 10, 20)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
RULES = ("results", "turn_budget")
TARGET_RECALL_AT_10 = 0.85
TARGET_MULTI_HOP_AT_10 = 0.60
TURNS_ALONE_REFERENCE = 0.786  # locomo_recall.json, final recall@10 on dev
MODE = "concise"  # HEED_RETAIN_EXTRACTION for the extracting variants
FORMAT = JsonSchemaFormat(name="facts", schema=FACTS_SCHEMA, strict=False)  # extraction's own


# -- what is retained ----------------------------------------------------------------


def limit_sessions(
    conversations: Sequence[Conversation], sessions: int | None
) -> list[Conversation]:
    """The conversations with only their first *sessions* sessions (all when ``None``)."""
    if sessions is None:
        return list(conversations)
    return [
        Conversation(c.sample_id, [t for t in c.turns if t.session <= sessions], c.questions)
        for c in conversations
    ]


def by_session(conversation: Conversation) -> dict[int, list[Turn]]:
    out: dict[int, list[Turn]] = defaultdict(list)
    for turn in conversation.turns:
        out[turn.session].append(turn)
    return out


def session_items(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    """The retain items of one session, exactly as ``_locomo.retain_conversation`` sends them."""
    return [
        {
            "content": turn.content(),
            "timestamp": turn.timestamp.isoformat(),
            "metadata": {"dia_id": turn.dia_id},
            "document_id": f"session-{turn.session}",
        }
        for turn in turns
    ]


def prepared_session(turns: Sequence[Turn]) -> PreparedDocument:
    """The session's document as retain splits it (its units, in order, not embedded)."""
    items = [
        RetainItem(
            content=turn.content(),
            timestamp=turn.timestamp,
            metadata={"dia_id": turn.dia_id},
            document_id=f"session-{turn.session}",
        )
        for turn in turns
    ]
    plan = DocumentPlan(f"session-{turns[0].session}", True, items, [])
    return split_documents([plan])[0]


# -- the oracle extractor ------------------------------------------------------------


@dataclass
class Oracle:
    """The scripted provider's script and what was placed in it."""

    replies: list[dict[str, Any]] = field(default_factory=list)
    annotation_facts: int = 0
    placed: int = 0
    dropped_no_turn: int = 0
    cut_to_first_chunk: int = 0
    chunks: int = 0
    chunks_without_annotation: int = 0
    covered: dict[str, set[str]] = field(default_factory=dict)  # bank -> dia_ids facts cite


def observations(data: Path) -> dict[str, dict[str, Any]]:
    """``observation`` of every conversation of the file, by sample id."""
    raw = json.loads(data.read_text())
    return {sample["sample_id"]: sample.get("observation") or {} for sample in raw}


def build_oracle(conversations: Sequence[Conversation], annotations: dict[str, Any]) -> Oracle:
    """One scripted reply per extraction chunk of *conversations* (see the module doc)."""
    oracle = Oracle()
    prompts: list[str] = []
    for conv in conversations:
        covered = oracle.covered.setdefault(conv.sample_id, set())
        for session, turns in sorted(by_session(conv).items()):
            document = prepared_session(turns)
            units = document.units
            chunks = chunk_units(units)
            chunk_of: dict[int, tuple[int, int]] = {}  # unit position -> (chunk, number in it)
            for c, positions in enumerate(chunks):
                for number, position in enumerate(positions):
                    chunk_of[position] = (c, number)
            positions_of: dict[str, list[int]] = defaultdict(list)
            for position, unit in enumerate(units):
                positions_of[unit.metadata["dia_id"]].append(position)
            facts: list[list[dict[str, Any]]] = [[] for _ in chunks]
            by_speaker = annotations.get(conv.sample_id, {}).get(
                f"session_{session}_observation", {}
            )
            for speaker, entries in by_speaker.items():
                for text, ref in entries:
                    oracle.annotation_facts += 1
                    refs = ref if isinstance(ref, list) else [ref]
                    cited = [p for r in refs for p in positions_of.get(str(r).strip(), [])]
                    if not cited:
                        oracle.dropped_no_turn += 1
                        continue
                    home = chunk_of[cited[0]][0]
                    numbers = [chunk_of[p][1] for p in cited if chunk_of[p][0] == home]
                    if len(numbers) < len(cited):
                        oracle.cut_to_first_chunk += 1
                    facts[home].append(
                        {
                            "text": text,
                            "fact_type": "experience",
                            "entities": [speaker],
                            "sources": sorted(set(numbers)),
                        }
                    )
                    covered.update(
                        units[p].metadata["dia_id"] for p in cited if chunk_of[p][0] == home
                    )
                    oracle.placed += 1
            for c, positions in enumerate(chunks):
                prompt = facts_prompt(units, positions, MODE, None)[-1].content
                prompts.append(prompt)
                oracle.replies.append({"when": prompt, "json": {"facts": facts[c][:64]}})
                oracle.chunks += 1
                oracle.chunks_without_annotation += not facts[c]
    lowered = [p.lower() for p in prompts]
    for i, prompt in enumerate(lowered):  # a reply matches the first `when` in the prompt
        if any(lowered[j] in prompt for j in range(i)):
            raise SystemExit(f"oracle: chunk {i}'s prompt contains an earlier chunk's prompt")
    return oracle


# -- one variant: a server, retain, recall, score -------------------------------------


@dataclass
class Bank:
    """What one bank holds: unit id -> its dia_id (verbatim) or its sources' (a fact)."""

    dia: dict[str, str | None] = field(default_factory=dict)
    document: dict[str, str | None] = field(default_factory=dict)
    sources: dict[str, list[str]] = field(default_factory=dict)

    def turns_of(self, result: dict[str, Any]) -> list[str]:
        """The dia_ids a recall result stands for (see the scoring rule)."""
        source_ids = result.get("source_fact_ids") or []
        if source_ids:
            return [d for d in (self.dia.get(s) for s in source_ids) if d]
        dia_id = (result.get("metadata") or {}).get("dia_id")
        return [dia_id] if dia_id else []


async def list_bank(http: httpx.AsyncClient, bank: str) -> Bank:
    out = Bank()
    offset = 0
    while True:
        response = await http.get(
            f"/v1/default/banks/{bank}/memories/list", params={"limit": 1000, "offset": offset}
        )
        response.raise_for_status()
        page = response.json()
        for item in page["items"]:
            if item.get("source_memory_ids"):
                out.sources[item["id"]] = list(item["source_memory_ids"])
            else:
                out.dia[item["id"]] = (item.get("metadata") or {}).get("dia_id")
            out.document[item["id"]] = item.get("document_id")
        offset += len(page["items"])
        if not page["items"] or offset >= page["total"]:
            return out


def questions_of(full: Conversation, retained: Conversation) -> list[dict[str, Any]]:
    """Questions of categories 1-4 whose evidence turns (those the conversation has) were all
    retained: every one on a full run, as ``locomo_recall.py`` asks them."""
    known = {t.dia_id for t in full.turns}
    kept = {t.dia_id for t in retained.turns}
    out = []
    for qa in full.questions:
        evidence = qa.get("evidence") or []
        if qa["category"] not in CATEGORIES or not evidence:
            continue
        real = [e for e in evidence if e in known]
        if real and all(e in kept for e in real):
            out.append(qa)
    return out


def ranked_turns(bank: Bank, results: list[dict[str, Any]], rule: str, k: int) -> set[str]:
    if rule == "results":
        return {d for r in results[:k] for d in bank.turns_of(r)}
    ordered = list(dict.fromkeys(d for r in results for d in bank.turns_of(r)))
    return set(ordered[:k])


def summarise(scores: dict[int, dict[int, list[float]]]) -> dict[str, Any]:
    total = sum(len(v[KS[0]]) for v in scores.values())
    overall = {
        f"recall@{k}": round(sum(sum(v[k]) for v in scores.values()) / max(1, total), 4) for k in KS
    }
    per_category = {
        CATEGORIES[c]: {
            "questions": len(v[KS[0]]),
            **{f"recall@{k}": round(sum(v[k]) / max(1, len(v[k])), 4) for k in KS},
        }
        for c, v in scores.items()
    }
    return {"overall": overall, "per_category": per_category}


async def retain_all(
    http: httpx.AsyncClient, variant: str, retained: Sequence[Conversation], progress: bool
) -> list[tuple[int, float]]:
    """Retain every session (one request each); (chunks, seconds) per session."""
    timings: list[tuple[int, float]] = []
    for conv in retained:
        bank = conv.sample_id
        (await http.put(f"/v1/default/banks/{bank}", json={"name": bank})).raise_for_status()
        for session, turns in sorted(by_session(conv).items()):
            chunks = len(chunk_units(prepared_session(turns).units))
            t0 = time.perf_counter()
            response = await http.post(
                f"/v1/default/banks/{bank}/memories", json={"items": session_items(turns)}
            )
            response.raise_for_status()
            seconds = time.perf_counter() - t0
            timings.append((chunks, seconds))
            if progress:
                print(
                    f"  [{variant}] {bank} session {session}: {chunks} chunk(s), {seconds:.1f} s",
                    flush=True,
                )
    return timings


def chunk_counts(conv: Conversation, bank: Bank) -> tuple[int, int]:
    """(chunks, chunks no fact came from) of *conv*'s sessions: a chunk gave facts when some
    fact's first source unit is in it (heed's own chunking, replayed). A malformed reply and
    a well-formed empty one both count as giving none: the retain does not tell them apart."""
    home: dict[tuple[str, str], tuple[int, int]] = {}
    chunks = 0
    for session, turns in by_session(conv).items():
        document = prepared_session(turns)
        for c, positions in enumerate(chunk_units(document.units)):
            chunks += 1
            for p in positions:
                dia_id = document.units[p].metadata["dia_id"]
                home.setdefault((f"session-{session}", dia_id), (session, c))
    productive = set()
    for sources in bank.sources.values():
        first = sources[0] if sources else ""
        key = (str(bank.document.get(first)), str(bank.dia.get(first)))
        if key in home:
            productive.add(home[key])
    return chunks, chunks - len(productive)


def new_scores() -> dict[int, dict[int, list[float]]]:
    return {c: {k: [] for k in KS} for c in CATEGORIES}


async def run_variant(
    variant: str,
    env: dict[str, str],
    full: Sequence[Conversation],
    retained: Sequence[Conversation],
    oracle: Oracle | None,
    progress: bool,
) -> dict[str, Any]:
    """Retain *retained* into a fresh server with *env*, ask the questions, score them."""
    scores = {rule: new_scores() for rule in RULES}
    facts_only = new_scores()
    fact_share: list[float] = []
    latencies: list[float] = []
    counts = {"verbatim_units": 0, "facts": 0, "chunks": 0, "chunks_without_facts": 0}
    coverage: list[float] = []
    per_question: dict[str, float] = {}
    source_counts: list[
        int
    ] = []  # turns each fact cites  # question key -> recall@10 (rule: results)
    with (
        tempfile.TemporaryDirectory(prefix=f"heed-extraction-{variant}-") as data_dir,
        serve(Path(data_dir), env) as server,
    ):
        async with httpx.AsyncClient(base_url=server.url, timeout=3600) as http:
            started = time.perf_counter()
            timings = await retain_all(http, variant, retained, progress)
            retain_seconds = time.perf_counter() - started
            for conv_full, conv in zip(full, retained, strict=True):
                bank = await list_bank(http, conv.sample_id)
                counts["verbatim_units"] += len(bank.dia)
                counts["facts"] += len(bank.sources)
                source_counts.extend(len(v) for v in bank.sources.values())
                chunks, barren = chunk_counts(conv, bank)
                counts["chunks"] += chunks
                counts["chunks_without_facts"] += barren
                cited = oracle.covered.get(conv.sample_id, set()) if oracle else None
                for number, qa in enumerate(questions_of(conv_full, conv)):
                    evidence = set(qa["evidence"])
                    if cited is not None:
                        coverage.append(len(evidence & cited) / len(evidence))
                    t0 = time.perf_counter()
                    response = await http.post(
                        f"/v1/default/banks/{conv.sample_id}/memories/recall",
                        json={"query": qa["question"], "max_tokens": 100_000},
                    )
                    latencies.append(time.perf_counter() - t0)
                    response.raise_for_status()
                    results = response.json()["results"]
                    top = results[:10]
                    facts_in_top = sum(1 for r in top if r.get("source_fact_ids"))
                    fact_share.append(facts_in_top / max(1, len(top)))
                    only = [r for r in results if r.get("source_fact_ids")]
                    category = qa["category"]
                    for k in KS:
                        for rule in RULES:
                            found = ranked_turns(bank, results, rule, k)
                            value = len(evidence & found) / len(evidence)
                            scores[rule][category][k].append(value)
                            if rule == "results" and k == 10:
                                per_question[f"{conv.sample_id}|{number}"] = value
                        found = ranked_turns(bank, only, "results", k)
                        facts_only[category][k].append(len(evidence & found) / len(evidence))
    extracting = variant != "turns"
    out: dict[str, Any] = {
        "env": {
            k: ("<script file>" if k == "HEED_RETAIN_LLM_SCRIPT" else v) for k, v in env.items()
        },
        "sessions": len(timings),
        **{k: v for k, v in counts.items() if extracting or k == "verbatim_units"},
        "questions": len(latencies),
        "retain_seconds": round(retain_seconds, 2),
        "recall_latency_ms": {
            "p50": round(percentile(latencies, 50) * 1000, 2),
            "p95": round(percentile(latencies, 95) * 1000, 2),
        },
    }
    if extracting:
        chunk_total = sum(c for c, _ in timings)
        out["retain_seconds_per_chunk"] = round(retain_seconds / max(1, chunk_total), 3)
        out["facts_share_of_top10"] = round(sum(fact_share) / max(1, len(fact_share)), 4)
        out["sources_per_fact"] = {
            "mean": round(sum(source_counts) / max(1, len(source_counts)), 2),
            "max": max(source_counts, default=0),
            "facts_citing_over_3": sum(1 for n in source_counts if n > 3),
        }
    for rule in RULES if extracting else RULES[:1]:
        out[rule] = summarise(scores[rule])
    if extracting:
        out["facts_only_diagnostic"] = summarise(facts_only)
    if coverage:
        out["evidence_cited_by_oracle_facts"] = round(sum(coverage) / len(coverage), 4)
    out["_per_question"] = per_question  # compared with turns by run_scope, then dropped
    return out


# -- the embedded model as extractor ----------------------------------------------------


@contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Send this process's stderr (fd 2, which a server subprocess inherits) to *path*."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("wb") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


async def live_probe(conv: Conversation, workdir: Path) -> dict[str, Any]:
    """Retain *conv*'s first session into a server whose retain provider is the embedded
    model: does the server survive extraction?"""
    turns = by_session(conv)[min(by_session(conv))]
    log = workdir / "live-probe-stderr.log"
    outcome: dict[str, Any] = {"env": LOCAL_ENV, "session_turns": len(turns)}
    t0 = time.perf_counter()
    with (
        stderr_to(log),
        tempfile.TemporaryDirectory(prefix="heed-extraction-probe-") as data_dir,
        serve(Path(data_dir), LOCAL_ENV) as server,
    ):
        async with httpx.AsyncClient(base_url=server.url, timeout=3600) as http:
            bank = conv.sample_id
            (await http.put(f"/v1/default/banks/{bank}", json={"name": bank})).raise_for_status()
            try:
                response = await http.post(
                    f"/v1/default/banks/{bank}/memories", json={"items": session_items(turns)}
                )
                outcome["retain_status"] = response.status_code
                outcome["retain_ok"] = response.status_code == 200
            except httpx.HTTPError as exc:
                outcome["retain_ok"] = False
                outcome["retain_error"] = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(0.5)
        outcome["server_exit_code"] = server.proc.poll()
    outcome["seconds"] = round(time.perf_counter() - t0, 2)
    lines = log.read_text(errors="replace").splitlines()
    outcome["server_stderr_notable"] = [
        line[:300] for line in lines if "::=" not in line and "error" in line.lower()
    ][:5]
    return outcome


def _without_bounds(node: Any) -> Any:
    """A JSON Schema without ``maxLength`` / ``maxItems`` (the grammar workaround)."""
    if isinstance(node, dict):
        return {k: _without_bounds(v) for k, v in node.items() if k not in GRAMMAR_BOUNDS}
    if isinstance(node, list):
        return [_without_bounds(v) for v in node]
    return node


GRAMMAR_BOUNDS = ("maxLength", "maxItems")


async def extract_in_process(
    retained: Sequence[Conversation], workdir: Path, progress: bool
) -> tuple[Path, dict[str, Any]]:
    """Run heed's extraction calls (the server's prompts, schema, validation and re-ask,
    ``complete_json`` on the ``local`` provider built as the server builds it) in this
    process, chunk by chunk, with one workaround: the llama.cpp grammar is built from the
    facts schema without its ``maxLength`` / ``maxItems`` (with them llama.cpp refuses the
    grammar and the server dies, see ``live_probe``); the replies are still validated
    against the full schema. Returns a script that replays the validated replies (a chunk
    that failed gets none, so it fails again in the server) and what happened."""
    import heed.llm.local as local  # needs llama-cpp-python (the `local` extra)
    from heed.llm.factory import build_provider
    from heed.settings import Settings

    original = local._grammar

    def relaxed(schema_json: str) -> Any:
        return original(json.dumps(_without_bounds(json.loads(schema_json)), sort_keys=True))

    local._grammar = relaxed  # type: ignore[assignment]  # the workaround, this process only
    provider = build_provider(Settings(retain_llm_provider="local"), "retain")
    replies: list[dict[str, Any]] = []
    seconds: list[float] = []
    attempts: list[int] = []
    failures: Counter[str] = Counter()
    retain_failing: set[str] = set()
    facts = 0
    samples: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        for conv in retained:
            for session, turns in sorted(by_session(conv).items()):
                units = prepared_session(turns).units
                for positions in chunk_units(units):
                    messages = facts_prompt(units, positions, MODE, None)
                    t0 = time.perf_counter()
                    try:
                        reply = await complete_json(provider, messages, FORMAT, temperature=0.0)
                    except BadModelOutput as exc:  # heed keeps the chunk verbatim
                        seconds.append(time.perf_counter() - t0)
                        failures[_failure_kind(str(exc))] += 1
                        if progress:
                            print(f"  [local] {conv.sample_id} s{session}: failed", flush=True)
                        continue
                    except ProviderError as exc:  # heed fails the whole retain on this
                        seconds.append(time.perf_counter() - t0)
                        failures[f"provider error: {str(exc)[:90]}"] += 1
                        retain_failing.add(f"{conv.sample_id} session {session}")
                        if progress:
                            print(f"  [local] {conv.sample_id} s{session}: {exc}", flush=True)
                        continue
                    seconds.append(time.perf_counter() - t0)
                    attempts.append(reply.attempts)
                    found = reply.value.get("facts", [])
                    facts += len(found)
                    if len(samples) < 12:
                        samples.extend(
                            {"text": f.get("text"), "sources": f.get("sources")} for f in found[:2]
                        )
                    replies.append({"when": messages[-1].content, "json": reply.value})
                    if progress:
                        print(
                            f"  [local] {conv.sample_id} s{session}: {len(found)} facts, "
                            f"{seconds[-1]:.1f} s",
                            flush=True,
                        )
    finally:
        await provider.aclose()
        local._grammar = original
    script = workdir / "local-replay.json"
    script.write_text(json.dumps({"replies": replies}))
    chunks = len(seconds)
    return script, {
        "how": "heed's extraction calls in this process on the local provider (grammar "
        "without maxLength/maxItems, replies validated against the full schema), "
        "the validated replies replayed into the server by the scripted provider",
        "seconds": round(time.perf_counter() - started, 1),
        "chunks": chunks,
        "failed_chunks": sum(failures.values()),
        "failures": dict(failures),
        "sessions_whose_live_retain_would_fail": sorted(retain_failing),
        "note_on_provider_errors": "a ProviderError other than malformed output (the re-ask "
        "prompt outgrowing the local model's 2,048-token context) is not caught by heed's "
        "extraction: the live retain of that session fails and writes nothing. Here such a "
        "chunk is counted as failed and kept verbatim, as a malformed reply would be",
        "facts_in_replies": facts,
        "seconds_per_chunk": {
            "mean": round(sum(seconds) / max(1, chunks), 2),
            "p50": round(percentile(seconds, 50), 2),
            "max": round(max(seconds, default=0.0), 2),
        },
        "good_replies_needing_a_re_ask": sum(1 for a in attempts if a > 1),
        "sample_facts": samples[:12],
    }


def _failure_kind(message: str) -> str:
    if "cut off at the token limit" in message:
        return "invalid JSON (cut off at the token limit)"
    if "not valid JSON" in message:
        return "invalid JSON"
    if "does not match" in message:
        return "schema violation"
    return message[:80]


async def run_local(
    full: Sequence[Conversation], retained: Sequence[Conversation], workdir: Path, progress: bool
) -> dict[str, Any]:
    """The embedded model as extractor: live when the server survives it, else replayed."""
    probe = await live_probe(retained[0], workdir)
    print(f"  live probe: {probe}", flush=True)
    if probe.get("retain_ok") and probe.get("server_exit_code") is None:
        result = await run_variant("local", LOCAL_ENV, full, retained, None, progress=True)
        result["path"] = "live: HEED_RETAIN_LLM_PROVIDER=local in the server"
    else:
        script, extraction = await extract_in_process(retained, workdir, progress=True)
        env = {**oracle_env(script)}
        result = await run_variant("local", env, full, retained, None, progress)
        result["path"] = "replayed: the live server crashed (live_probe); see in_process_extraction"
        result["in_process_extraction"] = extraction
    result["live_probe"] = probe
    return result


# -- the whole run --------------------------------------------------------------------


def scope_of(
    conversations: list[Conversation], n: int | None, sessions: int | None
) -> tuple[list[Conversation], list[Conversation], dict[str, Any]]:
    full = conversations[:n] if n else conversations
    retained = limit_sessions(full, sessions)
    scope = {
        "conversations": [c.sample_id for c in full],
        "sessions_per_conversation": sessions or "all",
        "turns": sum(len(c.turns) for c in retained),
    }
    return full, retained, scope


def oracle_env(script: Path) -> dict[str, str]:
    return {
        "HEED_RETAIN_EXTRACTION": MODE,
        "HEED_OBSERVATIONS": "off",
        "HEED_RETAIN_LLM_PROVIDER": "scripted",
        "HEED_RETAIN_LLM_SCRIPT": str(script),
    }


TURNS_ENV = {"HEED_RETAIN_EXTRACTION": "off", "HEED_OBSERVATIONS": "off"}
LOCAL_ENV = {
    "HEED_RETAIN_EXTRACTION": MODE,
    "HEED_OBSERVATIONS": "off",
    "HEED_RETAIN_LLM_PROVIDER": "local",
}


async def run_scope(
    name: str,
    variants: Sequence[str],
    conversations: list[Conversation],
    annotations: dict[str, Any],
    n: int | None,
    sessions: int | None,
    workdir: Path,
    progress: bool,
) -> dict[str, Any]:
    full, retained, scope = scope_of(conversations, n, sessions)
    oracle = build_oracle(retained, annotations)
    script = workdir / f"oracle-{name}.json"
    script.write_text(json.dumps({"replies": oracle.replies}))
    out: dict[str, Any] = {
        "scope": scope,
        "oracle_placement": {
            "annotation_facts": oracle.annotation_facts,
            "placed": oracle.placed,
            "dropped_no_turn": oracle.dropped_no_turn,
            "cut_to_first_chunk": oracle.cut_to_first_chunk,
            "chunks": oracle.chunks,
            "chunks_without_annotation": oracle.chunks_without_annotation,
        },
        "variants": {},
    }
    envs = {"turns": TURNS_ENV, "oracle": oracle_env(script)}
    for variant in variants:
        print(f"[{name}] {variant} ...", flush=True)
        if variant == "local":
            out["variants"][variant] = await run_local(full, retained, workdir, progress)
            continue
        out["variants"][variant] = await run_variant(
            variant,
            envs[variant],
            full,
            retained,
            oracle if variant == "oracle" else None,
            progress=progress or variant == "local",
        )
    turns = out["variants"].get("turns", {}).get("_per_question")
    for variant, values in out["variants"].items():
        mine = values["_per_question"]
        if turns is not None and variant != "turns":
            values["recall@10_vs_turns"] = {
                "better": sum(1 for q, v in mine.items() if v > turns.get(q, 0.0)),
                "worse": sum(1 for q, v in mine.items() if v < turns.get(q, 0.0)),
                "same": sum(1 for q, v in mine.items() if v == turns.get(q, 0.0)),
            }
    for values in out["variants"].values():
        del values["_per_question"]
    return out


def targets(dev: dict[str, Any]) -> list[dict[str, Any]]:
    oracle = dev["variants"].get("oracle")
    if oracle is None:
        return []
    at10 = oracle["results"]["overall"]["recall@10"]
    multi = oracle["results"]["per_category"]["multi-hop"]["recall@10"]
    turns = dev["variants"].get("turns", {}).get("results", {}).get("overall", {})
    return [
        {
            "name": "oracle facts + turns, recall@10 >= 0.85 (rule: results)",
            "value": at10,
            "met": at10 >= TARGET_RECALL_AT_10,
        },
        {
            "name": "oracle facts + turns, multi-hop recall@10 >= 0.60 (rule: results)",
            "value": multi,
            "met": multi >= TARGET_MULTI_HOP_AT_10,
        },
        {
            "name": f"reference: turns alone recall@10 (locomo_recall.json "
            f"{TURNS_ALONE_REFERENCE}; this run)",
            "value": turns.get("recall@10"),
            "met": None,
        },
    ]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    conversations = load_conversations(args.data)
    annotations = observations(args.data)
    variants = [v for v in ("turns", "oracle") if v in args.variants]
    with tempfile.TemporaryDirectory(prefix="heed-oracle-") as work:
        workdir = Path(work)
        result: dict[str, Any] = {
            "data": str(args.data),
            "extraction_mode": MODE,
            "scoring": {
                "turn_of_a_result": "a verbatim turn counts as its dia_id; a fact as the dia_ids "
                "of the units in its source_fact_ids (its provenance)",
                "results": "recall@k over the top k recall results (k results, each bringing "
                "its turns): the headline figure",
                "turn_budget": "the results' turns in rank order, deduplicated, the first k turns",
                "facts_only_diagnostic": "the facts of the same ranking alone (turns dropped), "
                "top k facts: what the facts carry by themselves",
                "questions": "categories 1-4 with evidence, whose evidence turns were retained",
            },
        }
        if variants:
            result["dev"] = await run_scope(
                "dev",
                variants,
                conversations,
                annotations,
                args.conversations,
                args.sessions,
                workdir,
                args.progress,
            )
            result["targets"] = targets(result["dev"])
        if "local" in args.variants:
            started = time.perf_counter()
            result["embedded"] = await run_scope(
                "embedded",
                ["turns", "oracle", "local"],
                conversations,
                annotations,
                args.local_conversations,
                args.local_sessions or None,
                workdir,
                args.progress,
            )
            result["embedded"]["wall_seconds"] = round(time.perf_counter() - started, 1)
    return result


def print_table(result: dict[str, Any]) -> None:
    for scope in ("dev", "embedded"):
        if scope not in result:
            continue
        block = result[scope]
        print(f"\n{scope}: {block['scope']}")
        print(f"  oracle placement: {block['oracle_placement']}")
        header = f"  {'variant':<8} {'rule':<12} {'@5':>6} {'@10':>6} {'@20':>6}  multi-hop@10"
        print(header)
        for variant, values in block["variants"].items():
            for rule in RULES:
                if rule not in values:
                    continue
                overall = values[rule]["overall"]
                multi = values[rule]["per_category"]["multi-hop"]["recall@10"]
                print(
                    f"  {variant:<8} {rule:<12} {overall['recall@5']:>6.3f} "
                    f"{overall['recall@10']:>6.3f} {overall['recall@20']:>6.3f}  {multi:.3f}"
                )
            extra = {
                k: values[k]
                for k in (
                    "questions",
                    "facts",
                    "chunks",
                    "chunks_without_facts",
                    "retain_seconds",
                    "retain_seconds_per_chunk",
                    "facts_share_of_top10",
                    "sources_per_fact",
                    "recall@10_vs_turns",
                )
                if k in values
            }
            print(f"           {extra}")
    for target in result.get("targets", []):
        print(f"target: {target['name']}: {target['value']} met={target['met']}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON (default: %(default)s)"
    )
    parser.add_argument(
        "--variants",
        default="turns,oracle,local",
        help="comma-separated, of turns, oracle, local (default: %(default)s)",
    )
    parser.add_argument(
        "--conversations", type=int, default=None, help="only the first N conversations"
    )
    parser.add_argument(
        "--sessions", type=int, default=None, help="only the first N sessions of each"
    )
    parser.add_argument(
        "--local-conversations",
        type=int,
        default=1,
        help="the embedded-model scope: first N conversations (default: %(default)s)",
    )
    parser.add_argument(
        "--local-sessions",
        type=int,
        default=10,
        help="the embedded-model scope: first N sessions of each (default: %(default)s; 0: all)",
    )
    parser.add_argument("--progress", action="store_true", help="print every session's retain")
    parser.add_argument(
        "--name", default="extraction_quality", help="results file name (without .json)"
    )
    args = parser.parse_args()
    args.variants = {v.strip() for v in args.variants.split(",") if v.strip()}
    unknown = args.variants - {"turns", "oracle", "local"}
    if unknown:
        parser.error(f"unknown variant(s): {', '.join(sorted(unknown))}")
    result = asyncio.run(run(args))
    print_table(result)
    print("wrote", write_result(args.name, result))


if __name__ == "__main__":
    main()
