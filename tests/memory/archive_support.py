"""Bank archives made in tests: a synthetic bank written by heed's own writer (any size,
no embedding needed), and a way to take an archive apart and zip it again changed."""

from __future__ import annotations

import io
import itertools
import json
import uuid
import zipfile
from collections.abc import Callable

import numpy as np

from heed.memory.models import Bank
from heed.transfer.archive import ArchiveWriter
from heed.transfer.rows import (
    ChunkRow,
    DocumentRow,
    EntityRow,
    LinkRow,
    MembershipRow,
    UnitRow,
)

MODEL = "onnx:all-MiniLM-L6-v2-int8"
DIM = 384
NOW = "2024-05-01T10:00:00+00:00"
WORDS = ("garden", "kayak", "violin", "harbour", "lantern", "meadow", "orchard", "pepper")


def _unit(i: int, document_id: str, chunk_id: str, rng: np.random.Generator) -> UnitRow:
    vector = rng.standard_normal(DIM).astype(np.float32)
    text = f"Speaker{i % 7}: note {i} about the {WORDS[i % len(WORDS)]} and the {WORDS[i % 3]}"
    return UnitRow(
        id=str(uuid.uuid4()),
        document_id=document_id,
        chunk_id=chunk_id,
        text=text,
        index_text=text,
        fact_type="world",
        context=None,
        occurred_start=NOW,
        occurred_end=NOW,
        mentioned_at=NOW,
        metadata={},
        tags=["synthetic"],
        created_at=NOW,
        updated_at=None,
        token_count=12,
        consolidation_state=None,
        source_ids=[],
        proof_count=None,
        history=[],
        vector=vector / np.linalg.norm(vector),
    )


def synthetic_archive(units: int, per_document: int = 100, bank_id: str = "synthetic") -> bytes:
    """A bank archive of *units* memories in documents of *per_document*, with an entity
    per speaker, its entity rows and temporal links (the writer's own format)."""
    rng = np.random.default_rng(units)
    out = io.BytesIO()
    writer = ArchiveWriter(
        out, scope="bank", source_bank_id=bank_id, embedding_model=MODEL, dim=DIM
    )
    writer.bank(Bank(tenant="t", bank_id=bank_id, ref="r", name=bank_id, created_at=NOW))
    rows: list[list[UnitRow]] = []
    documents = []
    for d, start in enumerate(range(0, units, per_document)):
        document_id = f"doc-{d:05d}"
        chunk = ChunkRow(str(uuid.uuid4()), 0, f"chunk of {document_id}")
        mine = [
            _unit(i, document_id, chunk.id, rng)
            for i in range(start, min(units, start + per_document))
        ]
        rows.append(mine)
        documents.append(
            DocumentRow(
                document_id,
                "\n".join(u.text for u in mine),
                None,
                {},
                [],
                NOW,
                NOW,
                len(mine),
                [chunk],
            )
        )
    writer.write("documents", documents)
    for mine in rows:
        writer.write("units", mine)
    speakers = [EntityRow(str(uuid.uuid4()), f"Speaker{s}", "person") for s in range(7)]
    writer.write("entities", speakers)
    flat = [u for mine in rows for u in mine]
    writer.write(
        "unit_entities", [MembershipRow(u.id, speakers[i % 7].id) for i, u in enumerate(flat)]
    )
    links = [
        LinkRow(a.id, b.id, "temporal", 1.0) for mine in rows for a, b in itertools.pairwise(mine)
    ]
    writer.write("links", links)
    writer.finish()
    return out.getvalue()


def entries(archive: bytes) -> dict[str, bytes]:
    """The archive's entries, by name, in order."""
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def zipped(files: list[tuple[str, bytes]], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    """*files* zipped in order (a name may repeat)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compression) as zf:
        for name, data in files:
            zf.writestr(name, data)
    return out.getvalue()


def changed(archive: bytes, change: Callable[[dict[str, bytes]], None]) -> bytes:
    """*archive* with its entries changed in place by *change* (a dict name -> bytes)."""
    files = entries(archive)
    change(files)
    return zipped(list(files.items()))


def manifest_of(files: dict[str, bytes]) -> dict[str, object]:
    parsed: dict[str, object] = json.loads(files["manifest.json"])
    return parsed


def with_manifest(files: dict[str, bytes], manifest: dict[str, object]) -> None:
    files["manifest.json"] = json.dumps(manifest).encode()


def first_unit_line(files: dict[str, bytes]) -> tuple[str, list[bytes]]:
    """The first units shard's name and lines."""
    name = next(n for n in files if n.startswith("units/"))
    return name, files[name].splitlines(keepends=True)
