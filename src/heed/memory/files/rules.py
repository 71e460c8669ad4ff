"""File retain's rules: which files heed reads, within which limits.

A file retain (``POST .../files/retain``) turns each uploaded file into one document.
This module holds the rules, free of HTTP and of parsing:

- **Formats** (:data:`FORMATS`), chosen by the file name's extension, else by its declared
  content type: plain text and Markdown (``.txt .md .markdown .csv .json .log``), HTML
  (``.html .htm``), PDF, and Office Open XML (``.docx .pptx .xlsx``). A file of any other
  type, a legacy binary Office file (``.doc .xls .ppt``) or one whose bytes are not what its
  name says (a ``.pdf`` not starting ``%PDF-``, a ``.docx`` that is no zip) is refused.
- **Limits** (:class:`FileLimits`): the file count, each file's size, what an Office file
  (a zip) unpacks to (checked from the zip's directory before any member is read, so a zip
  bomb is refused without inflating it; reads are capped at the declared sizes), the text
  one file may yield, the tags and cells a parse may walk (:mod:`heed.memory.files.readers`),
  and the CPU time, memory and wall-clock time of the process a file is parsed in
  (:mod:`heed.memory.files.parse`). Past a size limit: :class:`FileTooLarge` (413); past the
  count or for a bad file: :class:`FileRefused` (400). Each message names the file and the
  limit's setting.
- **Text**: text files must be UTF-8 (a BOM is dropped); bad UTF-8 is refused with the byte
  and its offset. No file's text may hold NUL (no store keeps it), and a file that yields no
  text (a scanned PDF: heed has no OCR) is refused.

:func:`split_text` cuts a long text into items of at most the engine's item size, at
paragraph breaks where it can.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import PurePath
from typing import Final

from heed.memory.models import InvalidInput

__all__ = [
    "FORMATS",
    "MAX_ZIP_MEMBERS",
    "FileLimits",
    "FileRefused",
    "FileTooLarge",
    "UploadedFile",
    "check_count",
    "check_size",
    "check_zip",
    "decode_utf8",
    "detect_format",
    "file_label",
    "short_error",
    "split_text",
]

#: Extension -> format.
FORMATS: Final[dict[str, str]] = {
    ".txt": "text",
    ".text": "text",
    ".csv": "text",
    ".json": "text",
    ".log": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
    ".docx": "docx",
    ".pptx": "pptx",
    ".xlsx": "xlsx",
}
_CONTENT_TYPES: Final[dict[str, str]] = {
    "text/plain": "text",
    "text/csv": "text",
    "application/json": "text",
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "text/html": "html",
    "application/pdf": "pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": "pptx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
}
_LEGACY_OFFICE: Final = {".doc": ".docx", ".xls": ".xlsx", ".ppt": ".pptx"}
#: Most members an Office zip may have.
MAX_ZIP_MEMBERS: Final = 10_000


class FileRefused(InvalidInput):
    """A file heed will not read, or a request past the file count (400); names the file."""


class FileTooLarge(InvalidInput):
    """A file past a size limit (413); names the file and the limit."""

    status_code = 413


@dataclass(frozen=True, slots=True)
class FileLimits:
    """What one file retain may hold (``HEED_FILE_*`` settings)."""

    max_files: int = 20
    max_bytes: int = 8 * 1024 * 1024
    max_unpacked_bytes: int = 64 * 1024 * 1024
    max_text_chars: int = 2_000_000
    max_tags: int = 2_000_000
    max_cells: int = 1_000_000
    parse_cpu_seconds: int = 30
    parse_memory_bytes: int = 1024 * 1024 * 1024
    parse_seconds: float = 60.0


@dataclass(frozen=True, slots=True)
class UploadedFile:
    """One uploaded file: its name as sent (possibly empty), declared type and bytes."""

    name: str
    content_type: str | None
    data: bytes


def file_label(index: int, file: UploadedFile) -> str:
    """How messages name a file: ``file 'report.pdf'`` or ``files[2]`` when it has no name."""
    return f"file {file.name!r}" if file.name else f"files[{index}]"


def check_count(count: int, limits: FileLimits) -> None:
    """Refuse no files, or more than ``max_files``."""
    if count == 0:
        raise FileRefused("no file: send one or more in the multipart field 'files'")
    if count > limits.max_files:
        raise FileRefused(
            f"{count} files sent; the limit is {limits.max_files} per request (HEED_FILE_MAX_FILES)"
        )


def check_size(index: int, file: UploadedFile, limits: FileLimits) -> None:
    """Refuse a file past ``max_bytes`` (413)."""
    if len(file.data) > limits.max_bytes:
        raise FileTooLarge(
            f"{file_label(index, file)} has {len(file.data)} bytes; the limit is "
            f"{limits.max_bytes} (HEED_FILE_MAX_BYTES)"
        )


def detect_format(index: int, file: UploadedFile) -> str:
    """The file's format (a value of :data:`FORMATS`), or :class:`FileRefused`."""
    label = file_label(index, file)
    suffix = PurePath(file.name).suffix.lower() if file.name else ""
    if suffix in _LEGACY_OFFICE:
        raise FileRefused(
            f"{label}: the legacy binary Office format {suffix} is not read; "
            f"save it as {_LEGACY_OFFICE[suffix]}"
        )
    fmt = FORMATS.get(suffix)
    if fmt is None:
        declared = (file.content_type or "").split(";")[0].strip().lower()
        fmt = _CONTENT_TYPES.get(declared) if not suffix else None
    if fmt is None:
        kinds = " ".join(sorted(FORMATS))
        raise FileRefused(f"{label}: unsupported file type; heed reads {kinds}")
    if fmt == "pdf" and not file.data.lstrip()[:5] == b"%PDF-":
        raise FileRefused(f"{label}: not a PDF (it does not start with %PDF-)")
    if fmt in ("docx", "pptx", "xlsx") and not file.data.startswith(b"PK"):
        raise FileRefused(f"{label}: not a {fmt} file (an Office file is a zip archive)")
    return fmt


def split_text(text: str, max_chars: int) -> list[str]:
    """*text* cut into pieces of at most *max_chars*, at paragraph breaks, else line breaks,
    else anywhere; pieces keep their order."""
    pieces: list[str] = []
    rest = text
    while len(rest) > max_chars:
        window = rest[:max_chars]
        cut = window.rfind("\n\n")
        if cut <= 0:
            cut = window.rfind("\n")
        if cut <= 0:
            cut = max_chars
        pieces.append(rest[:cut].strip())
        rest = rest[cut:].lstrip()
    if rest.strip():
        pieces.append(rest.strip())
    return [p for p in pieces if p]


def decode_utf8(label: str, data: bytes) -> str:
    """*data* as UTF-8 (a BOM dropped), or :class:`FileRefused` naming the bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileRefused(
            f"{label} is not valid UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start}"
        ) from None


def check_zip(label: str, data: bytes, limits: FileLimits) -> None:
    """Refuse a zip that is corrupt or would unpack past the limit, from its directory alone
    (reads are capped at the declared sizes, so a lying header cannot inflate more)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise FileRefused(f"{label}: corrupt Office file ({short_error(exc)})") from None
    if len(members) > MAX_ZIP_MEMBERS:
        raise FileRefused(
            f"{label}: the archive has {len(members)} members; the limit is {MAX_ZIP_MEMBERS}"
        )
    unpacked = sum(m.file_size for m in members)
    if unpacked > limits.max_unpacked_bytes:
        raise FileTooLarge(
            f"{label} unpacks to {unpacked} bytes; the limit is {limits.max_unpacked_bytes} "
            "(HEED_FILE_MAX_UNPACKED_BYTES)"
        )


def short_error(exc: BaseException) -> str:
    """*exc*'s message for a refusal: at most 200 characters."""
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."
