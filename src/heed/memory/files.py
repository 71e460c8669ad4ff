"""File retain's parsing rules: which files heed reads, how, and within which limits.

A file retain (``POST .../files/retain``) turns each uploaded file into one document.
This module holds the rules, free of HTTP:

- **Formats** (:data:`FORMATS`), chosen by the file name's extension, else by its declared
  content type: plain text and Markdown (``.txt .md .markdown .csv .json .log``), HTML
  (``.html .htm``), PDF, and Office Open XML (``.docx .pptx .xlsx``). A file of any other
  type, a legacy binary Office file (``.doc .xls .ppt``) or one whose bytes are not what its
  name says (a ``.pdf`` not starting ``%PDF-``, a ``.docx`` that is no zip) is refused.
- **Libraries**, one well-kept, pure-Python (or wheel-shipped) library per format, all
  offline: ``pypdf`` (PDF), ``python-docx``, ``python-pptx``, ``openpyxl`` (Office),
  ``beautifulsoup4`` (HTML). Each lets heed walk the file part by part (a page, a slide, a
  batch of paragraphs or rows), so the token is checked between parts: a client that leaves
  stops the parsing within one part (see :func:`extract_text`).
- **Limits** (:class:`FileLimits`): the file count, each file's size, what an Office file
  (a zip) unpacks to (checked from the zip's directory before any member is read, so a zip
  bomb is refused without inflating it; reads are capped at the declared sizes), and the text
  one file may yield. Past a size limit: :class:`FileTooLarge` (413); past the count or for
  a bad file: :class:`FileRefused` (400). Each message names the file and the limit.
- **Text**: text files must be UTF-8 (a BOM is dropped); bad UTF-8 is refused with the byte
  and its offset. No file's text may hold NUL (no store keeps it), and a file that yields no
  text (a scanned PDF: heed has no OCR) is refused.

:func:`extract_text` is blocking and checks the active token; callers run it in the offload
(:func:`heed.runtime.run_in_thread`). :func:`split_text` cuts a long text into items of at
most the engine's item size, at paragraph breaks where it can.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import PurePath
from typing import Final

from heed.errors import NUL
from heed.memory.models import InvalidInput
from heed.runtime import raise_if_cancelled, reraise_cancellation

__all__ = [
    "FORMATS",
    "FileLimits",
    "FileRefused",
    "FileTooLarge",
    "PartHook",
    "UploadedFile",
    "check_count",
    "check_size",
    "detect_format",
    "extract_text",
    "file_label",
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
_HTML_BLOCKS: Final = [
    *("p", "div", "br", "li", "tr", "td", "th", "pre", "blockquote", "section", "article"),
    *("h1", "h2", "h3", "h4", "h5", "h6", "dt", "dd", "table", "ul", "ol"),
]
#: Most members an Office zip may have.
MAX_ZIP_MEMBERS: Final = 10_000
#: Paragraphs or rows read between two token checks.
_BATCH: Final = 200

#: Called (in the parsing thread) after each part of a file is read: ``hook(file_name, part)``.
PartHook = Callable[[str, int], None]


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


def extract_text(
    index: int,
    file: UploadedFile,
    limits: FileLimits,
    hook: PartHook | None = None,
) -> tuple[str, str]:
    """``(format, text)`` of *file*: blocking, checks the token between parts.

    Raises :class:`FileRefused` (bad, corrupt, empty, unreadable) or :class:`FileTooLarge`
    (past ``max_bytes``, ``max_unpacked_bytes`` or ``max_text_chars``), naming the file.
    """
    label = file_label(index, file)
    check_size(index, file, limits)
    fmt = detect_format(index, file)
    raise_if_cancelled()
    parts = _Parts(label, limits.max_text_chars, file.name, hook)
    if fmt in ("text", "markdown"):
        parts.add(_utf8(label, file.data))
    elif fmt == "html":
        _html(label, file.data, parts)
    elif fmt == "pdf":
        _pdf(label, file.data, parts)
    else:
        _check_zip(label, file.data, limits)
        _office(label, fmt, file.data, parts)
    text = parts.text().strip()
    if NUL in text:
        raise FileRefused(f"{label} holds a NUL character (U+0000), which heed does not store")
    if not text:
        hint = " (a scanned PDF? heed has no OCR)" if fmt == "pdf" else ""
        raise FileRefused(f"{label}: no text found{hint}")
    return fmt, text


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


class _Parts:
    """The text of one file, part by part: the token is checked before each part, the text
    bound after it, and the hook told."""

    def __init__(self, label: str, max_chars: int, name: str, hook: PartHook | None) -> None:
        self.label = label
        self.max_chars = max_chars
        self.name = name
        self.hook = hook
        self.pieces: list[str] = []
        self.chars = 0
        self.count = 0

    def add(self, piece: str) -> None:
        raise_if_cancelled()
        if piece:
            self.pieces.append(piece)
            self.chars += len(piece) + 1
        if self.chars > self.max_chars:
            raise FileTooLarge(
                f"{self.label} yields more than {self.max_chars} characters of text "
                "(HEED_FILE_MAX_TEXT_CHARS)"
            )
        self.count += 1
        if self.hook is not None:
            self.hook(self.name, self.count)

    def text(self) -> str:
        return "\n\n".join(p for p in self.pieces if p.strip())


def _utf8(label: str, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileRefused(
            f"{label} is not valid UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start}"
        ) from None


def _html(label: str, data: bytes, parts: _Parts) -> None:
    from bs4 import BeautifulSoup

    try:
        soup = BeautifulSoup(data, "html.parser")
    except Exception as exc:  # noqa: BLE001 - a parser's any failure is a bad file
        reraise_cancellation(exc)
        raise FileRefused(f"{label}: unreadable HTML ({exc})") from None
    for tag in soup(["script", "style", "noscript", "template", "head"]):
        tag.decompose()
    for tag in soup(_HTML_BLOCKS):  # a block ends a line; inline tags stay in it
        tag.append("\n")
    lines = (" ".join(line.split()) for line in soup.get_text().splitlines())
    parts.add("\n".join(line for line in lines if line))


def _pdf(label: str, data: bytes, parts: _Parts) -> None:
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise FileRefused(f"{label}: the PDF is encrypted with a password")
        pages = reader.pages
        count = len(pages)
    except FileRefused:
        raise
    except Exception as exc:  # noqa: BLE001 - a parser's any failure is a bad file
        reraise_cancellation(exc)
        raise FileRefused(f"{label}: corrupt PDF ({_short(exc)})") from None
    for number in range(count):
        raise_if_cancelled()
        try:
            text = pages[number].extract_text() or ""
        except Exception as exc:  # noqa: BLE001 - a parser's any failure is a bad file
            reraise_cancellation(exc)
            problem = _short(exc)
            raise FileRefused(f"{label}: corrupt PDF page {number + 1} ({problem})") from None
        parts.add(text)


def _check_zip(label: str, data: bytes, limits: FileLimits) -> None:
    """Refuse a zip that is corrupt or would unpack past the limit, from its directory alone
    (reads are capped at the declared sizes, so a lying header cannot inflate more)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise FileRefused(f"{label}: corrupt Office file ({_short(exc)})") from None
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


def _office(label: str, fmt: str, data: bytes, parts: _Parts) -> None:
    try:
        for piece in _OFFICE_READERS[fmt](io.BytesIO(data)):
            parts.add(piece)
    except (FileRefused, FileTooLarge):
        raise
    except Exception as exc:  # noqa: BLE001 - a parser's any failure is a bad file
        reraise_cancellation(exc)
        raise FileRefused(f"{label}: corrupt {fmt} file ({_short(exc)})") from None


def _batches(lines: Iterator[str]) -> Iterator[str]:
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= _BATCH:
            yield "\n".join(batch)
            batch = []
    if batch:
        yield "\n".join(batch)


def _docx(stream: io.BytesIO) -> Iterator[str]:
    import docx

    document = docx.Document(stream)

    def lines() -> Iterator[str]:
        for paragraph in document.paragraphs:
            yield paragraph.text
        for table in document.tables:
            for row in table.rows:
                yield " | ".join(cell.text.strip() for cell in row.cells)

    yield from _batches(lines())


def _pptx(stream: io.BytesIO) -> Iterator[str]:
    from pptx import Presentation

    for number, slide in enumerate(Presentation(stream).slides, 1):
        texts = [f"Slide {number}"]
        for shape in slide.shapes:
            if getattr(shape, "has_text_frame", False):
                texts.append(shape.text_frame.text)
            if getattr(shape, "has_table", False):
                for row in shape.table.rows:
                    texts.append(" | ".join(cell.text.strip() for cell in row.cells))
        yield "\n".join(t for t in texts if t.strip())


def _xlsx(stream: io.BytesIO) -> Iterator[str]:
    from openpyxl import load_workbook

    workbook = load_workbook(stream, read_only=True, data_only=True)
    try:
        for sheet in workbook.worksheets:

            def rows(sheet: object = sheet) -> Iterator[str]:
                yield f"Sheet {sheet.title}"  # type: ignore[attr-defined]
                for row in sheet.iter_rows(values_only=True):  # type: ignore[attr-defined]
                    cells = [str(c) for c in row if c is not None and str(c).strip()]
                    if cells:
                        yield "\t".join(cells)

            yield from _batches(rows())
    finally:
        workbook.close()


_OFFICE_READERS: Final[dict[str, Callable[[io.BytesIO], Iterator[str]]]] = {
    "docx": _docx,
    "pptx": _pptx,
    "xlsx": _xlsx,
}


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."
