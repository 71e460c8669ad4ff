"""The bank archive: a versioned zip of sections, written and read in bounded pieces.

docs/bank-archive.md is the format's reference; this module is its implementation.

**Container.** A zip (stored or deflated entries only) holding ``manifest.json`` and, per
section, its entries: ``bank.json`` (one JSON object), else JSON lines in numbered shards
``<section>/000001.jsonl`` of at most :data:`RECORDS_PER_ENTRY` records. The manifest
names the format and its :data:`VERSION`, what was exported (``scope``: a whole ``bank``,
or ``documents``), the source bank, the embedding model and vector size, and the sections
with their entries and record counts, in :data:`SECTIONS` order.

**Versions and sections.** A reader takes every version up to its own and refuses a newer
one by number; it refuses a section it does not know by name (never skipped: that would
lose data silently), and a section newer than the archive's version (its ``since``). The
sections are :mod:`heed.transfer.sections`' registry: each one module, which encodes and
decodes its records. Version 2 added ``webhooks``, ``knowledge_folders`` and
``mental_models``; archives of version 1 still import, without them. A section an archive
lacks is empty.

**Bounded.** :class:`ArchiveWriter` streams records into the open entry (one at a time,
as zipfile writes); :class:`ArchiveReader` reads one line at a time. Neither holds more
than a record and zipfile's buffers, whatever the bank's size.

**Hostile archives.** :class:`ArchiveReader` refuses, before reading any record, what is
not a zip, entries it would not write (a name that is not a manifest, a bank or a numbered
shard of a known section: so no path trick reaches anything, and nothing is ever extracted
to disk), a name twice, directories, encrypted or otherwise compressed entries, more than
:attr:`ArchiveLimits.max_entries` entries, an entry declaring more than
:attr:`ArchiveLimits.max_entry_bytes` or a compression ratio past
:attr:`ArchiveLimits.max_ratio` (a zip bomb), more than
:attr:`ArchiveLimits.max_unpacked_bytes` in all, and an entry the manifest does not list
(or one it lists that is missing). Reads are capped at the declared sizes (zipfile stops
there and checks the CRC), a line at :attr:`ArchiveLimits.max_record_bytes`.
:func:`heed.transfer.check.check_archive` then reads every record once
(:mod:`heed.transfer.records`: types, UTF-8, JSON; each section's record) and checks what
spans records, in memory that does not follow the archive's size. A record's JSON is
decoded only when it holds at most :attr:`ArchiveLimits.max_record_values` values (counted from its
bytes first: a line of ``[{},{},...]`` would otherwise cost twenty times its size). Every refusal
is an
:class:`~heed.transfer.records.InvalidArchive` (400) naming the entry and line.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any, Final, Literal

from heed.memory.models import Bank
from heed.runtime import raise_if_cancelled, reraise_cancellation
from heed.transfer.records import MANIFEST, InvalidArchive, check_values, parse_line
from heed.transfer.sections import BY_NAME, REGISTRY

if TYPE_CHECKING:
    from heed.transfer.sections.bank import BankRecord

__all__ = [
    "FORMAT",
    "MANIFEST",
    "RECORDS_PER_ENTRY",
    "SECTIONS",
    "SECTION_SINCE",
    "VERSION",
    "ArchiveLimits",
    "ArchiveReader",
    "ArchiveWriter",
    "InvalidArchive",
    "Manifest",
]

FORMAT: Final = "heed-bank-archive"
#: The format version this heed writes, and the newest it reads.
VERSION: Final = 2
#: The sections' names, in the order they are written and read (the registry's).
SECTIONS: Final = tuple(section.name for section in REGISTRY)
#: The format version that added each section.
SECTION_SINCE: Final = {section.name: section.since for section in REGISTRY}
#: The bank's profile and settings: a documents archive holds none of these.
_BANK_ONLY: Final = tuple(s.name for s in REGISTRY if s.group in ("bank", "config"))
#: The entries of the sections of one record each (``bank.json``).
_SINGLE: Final = frozenset(f"{s.name}.json" for s in REGISTRY if s.single)
#: Records per shard of a section.
RECORDS_PER_ENTRY: Final = 5000
#: Records written or read between two token checks (a few milliseconds of work).
CHECK_EVERY: Final = 32
#: Deflate's level: 1 is three times faster than the default 6 and the archive barely
#: larger (base64 vectors, most of it, hardly compress at any level).
COMPRESS_LEVEL: Final = 1
#: A shard's name: ``<section>/<six digits>.jsonl``.
_SHARD: Final = re.compile(r"^([a-z_]{1,32})/(\d{6})\.jsonl$")
#: The manifest's own size limit.
_MANIFEST_BYTES: Final = 4 * 1024 * 1024

Scope = Literal["bank", "documents"]


@dataclass(frozen=True, slots=True)
class ArchiveLimits:
    """What an archive may hold (see the module docstring)."""

    max_entries: int = 100_000
    max_entry_bytes: int = 512 * 1024 * 1024
    max_unpacked_bytes: int = 16 * 1024 * 1024 * 1024
    max_record_bytes: int = 64 * 1024 * 1024
    max_record_values: int = 1_000_000
    max_ratio: int = 200
    max_records: int = 20_000_000


@dataclass(frozen=True, slots=True)
class Section:
    """A section of an archive: its entries (in order) and how many records they hold."""

    name: str
    entries: tuple[str, ...]
    records: int


@dataclass(frozen=True, slots=True)
class Manifest:
    """``manifest.json``: what an archive holds."""

    version: int
    scope: Scope
    source_bank_id: str
    embedding_model: str
    dim: int
    created_at: str
    written_by: str
    sections: dict[str, Section]

    def records(self, section: str) -> int:
        found = self.sections.get(section)
        return found.records if found is not None else 0

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": FORMAT,
                "version": self.version,
                "scope": self.scope,
                "created_at": self.created_at,
                "written_by": self.written_by,
                "source": {"bank_id": self.source_bank_id},
                "embedding": {"model": self.embedding_model, "dim": self.dim},
                "sections": [
                    {"name": s.name, "entries": list(s.entries), "records": s.records}
                    for s in self.sections.values()
                ],
            },
            indent=2,
        ).encode("utf-8")


def _json(value: dict[str, Any]) -> bytes:
    """A record as the archive holds it (UTF-8 JSON, no newline)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")


def _written_by() -> str:
    try:
        return f"heed {importlib.metadata.version('heed')}"
    except importlib.metadata.PackageNotFoundError:
        return "heed"


# -- writing ---------------------------------------------------------------------------------


class ArchiveWriter:
    """Writes an archive into *target* (a binary file), section after section.

    Call :meth:`bank` (a whole bank's archive only), then :meth:`write` with each section's
    rows in :data:`SECTIONS` order, then :meth:`finish`, which writes the manifest and the
    zip's directory. *compress* ``False`` stores entries (a clone's archive never leaves
    the process: no time spent deflating). *content*, when given, is fed every record's
    bytes with its section's name, in order, and nothing of the manifest (which says when
    and by what the archive was written): two archives it was fed the same bytes for hold
    the same records (an export's reuse, :mod:`heed.transfer.service`).
    """

    def __init__(
        self,
        target: IO[bytes],
        *,
        scope: Scope,
        source_bank_id: str,
        embedding_model: str,
        dim: int,
        compress: bool = True,
        content: Callable[[bytes], object] | None = None,
    ) -> None:
        self._content = content
        self.zip = zipfile.ZipFile(
            target,
            "w",
            compression=zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED,
            compresslevel=COMPRESS_LEVEL if compress else None,
        )
        self.scope: Scope = scope
        self.source_bank_id = source_bank_id
        self.embedding_model = embedding_model
        self.dim = dim
        self._sections: dict[str, Section] = {}
        self._current: str | None = None
        self._entry: IO[bytes] | None = None
        self._in_entry = 0
        self._entries: list[str] = []
        self._records = 0

    def bank(self, bank: Bank) -> None:
        """Write the ``bank`` section (the profile and configuration)."""
        self.write("bank", [bank])

    def _single(self, section: str, row: Any) -> None:
        """Write the one record of a *single* section, in ``<section>.json``."""
        entry = f"{section}.json"
        record = _json(BY_NAME[section].encode(row))
        if self._content is not None:
            self._content(record)
        self.zip.writestr(entry, record)
        self._sections[section] = Section(section, (entry,), 1)
        self._current = None

    def _start(self, section: str) -> None:
        if section not in SECTIONS:
            raise ValueError(f"no section {section!r}")
        order = SECTIONS.index(section)
        if self._current is not None and self._current != section:
            self._close_section()
        if self._current is None:
            if any(SECTIONS.index(done) >= order for done in self._sections):
                raise ValueError(f"section {section!r} out of order")
            self._current = section
            if self._content is not None:
                self._content(b"\x00" + section.encode() + b"\x00")  # where a section begins

    def write(self, section: str, rows: list[Any]) -> None:
        """Append *rows* to *section* (the current one, or the next in order; a single
        section takes one row)."""
        self._start(section)
        spec = BY_NAME[section]
        if spec.single:
            (row,) = rows
            self._single(section, row)
            return
        encode = spec.encode
        for row in rows:
            if self._entry is None or self._in_entry >= RECORDS_PER_ENTRY:
                self._next_entry(section)
            assert self._entry is not None
            if self._records % CHECK_EVERY == 0:
                raise_if_cancelled()
            record = _json(encode(row)) + b"\n"
            if self._content is not None:
                self._content(record)
            self._entry.write(record)
            self._in_entry += 1
            self._records += 1

    def _next_entry(self, section: str) -> None:
        if self._entry is not None:
            self._entry.close()
        name = f"{section}/{len(self._entries) + 1:06d}.jsonl"
        self._entries.append(name)
        self._entry = self.zip.open(name, "w", force_zip64=True)
        self._in_entry = 0

    def _close_section(self) -> None:
        if self._entry is not None:
            self._entry.close()
        assert self._current is not None
        self._sections[self._current] = Section(self._current, tuple(self._entries), self._records)
        self._current, self._entry, self._entries, self._records = None, None, [], 0
        self._in_entry = 0

    def finish(self) -> Manifest:
        """Close the last section, write the manifest and the zip's directory."""
        if self._current is not None:
            self._close_section()
        manifest = Manifest(
            version=VERSION,
            scope=self.scope,
            source_bank_id=self.source_bank_id,
            embedding_model=self.embedding_model,
            dim=self.dim,
            created_at=datetime.now(UTC).isoformat(),
            written_by=_written_by(),
            sections=dict(self._sections),
        )
        self.zip.writestr(MANIFEST, manifest.to_json())
        self.zip.close()
        return manifest

    def abort(self) -> None:
        """Close what is open after a failure (the target is garbage)."""
        try:
            if self._entry is not None:
                self._entry.close()
        finally:
            self.zip.close()


# -- reading ---------------------------------------------------------------------------------


def _manifest(value: dict[str, Any]) -> Manifest:
    """The manifest in *value*, checked (see the module docstring)."""
    if value.get("format") != FORMAT:
        raise InvalidArchive(f"{MANIFEST}: format is {value.get('format')!r}, not {FORMAT!r}")
    version = value.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidArchive(f"{MANIFEST}: version {version!r} is not a format version")
    if version > VERSION:
        raise InvalidArchive(
            f"archive format version {version} is newer than this heed reads (up to {VERSION})"
        )
    known = {"format", "version", "scope", "created_at", "written_by", "source", "embedding"}
    extra = set(value) - known - {"sections"}
    if extra:
        raise InvalidArchive(f"{MANIFEST}: unknown field(s) {sorted(extra)}")
    scope = value.get("scope")
    if scope not in ("bank", "documents"):
        raise InvalidArchive(f"{MANIFEST}: scope {scope!r} is neither 'bank' nor 'documents'")
    source = value.get("source")
    embedding = value.get("embedding")
    if not isinstance(source, dict) or not isinstance(source.get("bank_id"), str):
        raise InvalidArchive(f"{MANIFEST}: source.bank_id is missing")
    if (
        not isinstance(embedding, dict)
        or not isinstance(embedding.get("model"), str)
        or not isinstance(embedding.get("dim"), int)
        or isinstance(embedding.get("dim"), bool)
        or not 1 <= embedding["dim"] <= 65_536
    ):
        raise InvalidArchive(f"{MANIFEST}: embedding needs a model name and a dim (1-65536)")
    raw_sections = value.get("sections")
    if not isinstance(raw_sections, list):
        raise InvalidArchive(f"{MANIFEST}: sections must be a list")
    sections: dict[str, Section] = {}
    for raw in raw_sections:
        if not isinstance(raw, dict) or set(raw) != {"name", "entries", "records"}:
            raise InvalidArchive(f"{MANIFEST}: a section is {{name, entries, records}}")
        name, entries, records = raw["name"], raw["entries"], raw["records"]
        if name not in SECTIONS:
            raise InvalidArchive(
                f"section {name!r} is not one this heed imports (format version {VERSION} "
                f"has {', '.join(SECTIONS)})"
            )
        if SECTION_SINCE[name] > version:
            raise InvalidArchive(
                f"section {name!r} is not in format version {version} "
                f"(it came with version {SECTION_SINCE[name]})"
            )
        if name in sections:
            raise InvalidArchive(f"{MANIFEST}: section {name!r} twice")
        if SECTIONS.index(name) < max((SECTIONS.index(s) for s in sections), default=-1):
            raise InvalidArchive(f"{MANIFEST}: section {name!r} out of order")
        if (
            not isinstance(records, int)
            or isinstance(records, bool)
            or records < 0
            or not isinstance(entries, list)
            or not all(isinstance(e, str) for e in entries)
        ):
            raise InvalidArchive(f"{MANIFEST}: section {name!r} has bad entries or records")
        for entry in entries:
            single = BY_NAME[name].single
            expected = entry == f"{name}.json" if single else _shard_of(entry) == name
            if not expected:
                raise InvalidArchive(
                    f"{MANIFEST}: entry {entry[:100]!r} does not belong to section {name!r}"
                )
        sections[name] = Section(name, tuple(entries), records)
    bank = sections.get("bank")
    if scope == "bank" and (bank is None or bank.records != 1 or len(bank.entries) != 1):
        raise InvalidArchive(f"{MANIFEST}: a bank archive holds one bank record")
    if scope == "documents" and any(name in sections for name in _BANK_ONLY):
        raise InvalidArchive(
            f"{MANIFEST}: a documents archive holds no {', '.join(_BANK_ONLY)} section"
        )
    return Manifest(
        version=version,
        scope=scope,
        source_bank_id=str(source["bank_id"]),
        embedding_model=str(embedding["model"]),
        dim=int(embedding["dim"]),
        created_at=str(value.get("created_at", "")),
        written_by=str(value.get("written_by", "")),
        sections=sections,
    )


def _damaged(entry: str, exc: Exception) -> InvalidArchive:
    """*exc*, raised reading *entry*, as the refusal to give (a refusal stays itself)."""
    if isinstance(exc, InvalidArchive):
        return exc
    return InvalidArchive(f"entry {entry!r} is damaged ({type(exc).__name__}: {exc})")


def _shard_of(name: str) -> str | None:
    match = _SHARD.fullmatch(name)
    return match[1] if match else None


def _readable(name: str) -> bool:
    """Whether *name* is an entry heed writes (the path-trick guard)."""
    return name == MANIFEST or name in _SINGLE or _shard_of(name) in SECTIONS


class ArchiveReader:
    """Reads an archive from *source* (a seekable binary file); the zip's directory and the
    manifest are checked on opening (see the module docstring)."""

    def __init__(self, source: IO[bytes], limits: ArchiveLimits | None = None) -> None:
        self.limits = limits or ArchiveLimits()
        try:
            self.zip = zipfile.ZipFile(source)
        except Exception as exc:  # zipfile's many ways to say "not a zip I can read"
            reraise_cancellation(exc)
            raise InvalidArchive(f"not a zip archive heed can read ({exc})") from exc
        try:
            self._check_directory()
            self.manifest = _manifest(self._manifest_json())
            self._check_listed()
        except BaseException:
            self.zip.close()
            raise

    def close(self) -> None:
        self.zip.close()

    def __enter__(self) -> ArchiveReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_directory(self) -> None:
        infos = self.zip.infolist()
        limits = self.limits
        if len(infos) > limits.max_entries:
            raise InvalidArchive(f"{len(infos)} entries; the limit is {limits.max_entries}")
        seen: set[str] = set()
        total = 0
        for info in infos:
            name = info.filename
            shown = repr(name[:100])
            if name in seen:
                raise InvalidArchive(f"entry {shown} is in the archive twice")
            seen.add(name)
            if info.is_dir() or not _readable(name):
                raise InvalidArchive(
                    f"entry {shown} is not one a heed archive holds "
                    "(manifest.json, bank.json, <section>/<number>.jsonl)"
                )
            if info.flag_bits & 0x1:
                raise InvalidArchive(f"entry {shown} is encrypted")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise InvalidArchive(
                    f"entry {shown} uses compression method {info.compress_type} "
                    "(heed reads stored and deflated entries)"
                )
            if info.file_size > limits.max_entry_bytes:
                raise InvalidArchive(
                    f"entry {shown} declares {info.file_size} bytes; the limit is "
                    f"{limits.max_entry_bytes}"
                )
            if info.file_size > 1024 * 1024 and info.file_size > limits.max_ratio * max(
                1, info.compress_size
            ):
                raise InvalidArchive(
                    f"entry {shown} would unpack {info.compress_size} bytes into "
                    f"{info.file_size} (more than {limits.max_ratio} times: a zip bomb?)"
                )
            total += info.file_size
        if total > limits.max_unpacked_bytes:
            raise InvalidArchive(
                f"the entries declare {total} bytes in all; the limit is "
                f"{limits.max_unpacked_bytes}"
            )
        if MANIFEST not in seen:
            raise InvalidArchive(f"no {MANIFEST}: not a heed bank archive")

    def _manifest_json(self) -> dict[str, Any]:
        info = self.zip.getinfo(MANIFEST)
        if info.file_size > _MANIFEST_BYTES:
            raise InvalidArchive(f"{MANIFEST} declares {info.file_size} bytes")
        return parse_line(self._read_whole(MANIFEST, _MANIFEST_BYTES), MANIFEST)

    def _check_listed(self) -> None:
        listed = {e for s in self.manifest.sections.values() for e in s.entries}
        names = set(self.zip.namelist()) - {MANIFEST}
        for name in sorted(names - listed):
            raise InvalidArchive(f"entry {name[:100]!r} is not listed in {MANIFEST}")
        for name in sorted(listed - names):
            raise InvalidArchive(f"entry {name[:100]!r} is listed in {MANIFEST} but missing")
        if len(listed) != sum(len(s.entries) for s in self.manifest.sections.values()):
            raise InvalidArchive(f"{MANIFEST} lists an entry twice")

    def _read_whole(self, name: str, limit: int) -> bytes:
        try:
            with self.zip.open(name) as stream:
                data = stream.read(limit + 1)
        except Exception as exc:
            reraise_cancellation(exc)
            raise _damaged(name, exc) from exc
        if len(data) > limit:
            raise InvalidArchive(f"entry {name!r} is larger than {limit} bytes")
        return data

    def bank(self) -> BankRecord | None:
        """The ``bank`` record (``None`` in a documents archive)."""
        if "bank" not in self.manifest.sections:
            return None
        data = self._read_whole("bank.json", self.limits.max_record_bytes)
        check_values(data, self.limits.max_record_values, "bank.json")
        record: BankRecord = BY_NAME["bank"].decode(
            parse_line(data, "bank.json"), self.manifest.dim, "bank.json"
        )
        return record

    def lines(self, section: str) -> Iterator[tuple[bytes, str]]:
        """The raw lines of *section* (each with ``entry:line`` for messages), one at a
        time; the token is checked every :data:`CHECK_EVERY` lines."""
        found = self.manifest.sections.get(section)
        if found is None:
            return
        limit = self.limits.max_record_bytes
        for entry in found.entries:
            try:
                with self.zip.open(entry) as stream:
                    number = 0
                    while True:
                        line = stream.readline(limit + 1)
                        if not line:
                            break
                        number += 1
                        if number % CHECK_EVERY == 0:
                            raise_if_cancelled()
                        where = f"{entry}:{number}"
                        if len(line) > limit or not line.endswith(b"\n"):
                            if len(line) > limit:
                                raise InvalidArchive(f"{where}: a record over {limit} bytes")
                            raise InvalidArchive(f"{where}: the last record lacks its newline")
                        yield line[:-1], where
            except Exception as exc:
                reraise_cancellation(exc)
                raise _damaged(entry, exc) from exc

    def rows(self, section: str) -> Iterator[Any]:
        """The rows of *section* (its module's decoding), each checked on its own."""
        dim = self.manifest.dim
        decode = BY_NAME[section].decode
        for line, where in self.lines(section):
            check_values(line, self.limits.max_record_values, where)
            yield decode(parse_line(line, where), dim, where)
