"""Readers: the text of one file of each format, in bounded work.

Each reader walks its file part by part (a page, a slide, a batch of paragraphs or rows)
and hands the text to a :class:`TextSink`, which bounds the text a file may yield. What a
parser would otherwise do in proportion to what the file *declares* rather than to its
bytes is bounded here, per format:

- **HTML** is read by a streaming walk over the standard library's tokenizer
  (:class:`html.parser.HTMLParser`): no tree is built or changed, so its cost follows the
  bytes; at most :attr:`ReadBounds.max_tags` tags and a nesting of
  :data:`MAX_HTML_DEPTH`. (A tree walk that appended a line break to every block element
  walked to the block's last descendant each time: quadratic in the nesting.)
- **Office files** (a zip of XML): before a library parses a member, its tags are counted
  from its bytes (:func:`count_tags`), at most :attr:`ReadBounds.max_tags` in all, since a
  library builds the whole XML tree of a member in memory (python-docx and python-pptx;
  openpyxl for its shared strings). A spreadsheet's sheets are streamed instead and their
  cells counted as they are scanned (:attr:`ReadBounds.max_cells`); a sheet's declared
  ``<dimension>`` is ignored (openpyxl pads every row to it: a few bytes declaring
  16,384 columns by a million rows). A Word table yields one text per ``w:tc`` element, not
  one per column a cell spans (``gridSpan``).
- **PDF** is read page by page (pypdf).

Past a bound: :class:`~heed.memory.files.rules.FileTooLarge` naming the file and the setting.
A parser's own failure is :class:`~heed.memory.files.rules.FileRefused` ("corrupt ...").
``MemoryError`` is never taken for a corrupt file: it reaches the caller, which runs readers
in a process with a memory limit (:mod:`heed.memory.files.parse`).
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Final

from heed.memory.files.rules import FileRefused, FileTooLarge, short_error

__all__ = [
    "MAX_HTML_DEPTH",
    "ReadBounds",
    "TextSink",
    "count_tags",
    "read_html",
    "read_office",
    "read_pdf",
]

#: Deepest nesting of HTML elements read (browsers stop nesting at 512).
MAX_HTML_DEPTH: Final = 4096
#: Paragraphs or rows handed over as one part.
_BATCH: Final = 200
#: Bytes of a zip member read at a time while its tags are counted.
_CHUNK: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ReadBounds:
    """How much work one file's text may take, whatever the file declares."""

    max_text_chars: int = 2_000_000
    max_tags: int = 2_000_000
    max_cells: int = 1_000_000


class TextSink:
    """Collects one file's text part by part, refusing more than ``max_chars`` of it.

    *on_part* (when given) is called after each part with the number of parts so far.
    """

    def __init__(self, label: str, max_chars: int, on_part: Callable[[int], None] | None) -> None:
        self.label = label
        self.max_chars = max_chars
        self.on_part = on_part
        self.pieces: list[str] = []
        self.chars = 0
        self.count = 0

    def add(self, piece: str) -> None:
        if piece:
            self.pieces.append(piece)
            self.chars += len(piece) + 1
        if self.chars > self.max_chars:
            raise FileTooLarge(
                f"{self.label} yields more than {self.max_chars} characters of text "
                "(HEED_FILE_MAX_TEXT_CHARS)"
            )
        self.count += 1
        if self.on_part is not None:
            self.on_part(self.count)

    def text(self) -> str:
        return "\n\n".join(p for p in self.pieces if p.strip())


def _too_many_tags(label: str, bounds: ReadBounds) -> FileTooLarge:
    return FileTooLarge(f"{label} holds more than {bounds.max_tags} tags (HEED_FILE_MAX_TAGS)")


# -- HTML --------------------------------------------------------------------------------------

#: Elements whose content is not text a reader sees.
_HIDDEN: Final = frozenset({"script", "style", "noscript", "template", "head", "title"})
#: Elements that end a line (before and after them).
_BLOCKS: Final = frozenset(
    {
        *("p", "div", "br", "li", "tr", "td", "th", "pre", "blockquote", "section", "article"),
        *("h1", "h2", "h3", "h4", "h5", "h6", "dt", "dd", "table", "ul", "ol", "hr"),
        *("header", "footer", "main", "nav", "aside", "figure", "figcaption", "form"),
    }
)
#: Elements with no content and no end tag.
_VOID: Final = frozenset(
    {
        *("area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta"),
        *("param", "source", "track", "wbr", "keygen"),
    }
)
#: Elements a start tag of the same name ends when one is open near the top (``<li>a<li>b``).
_SELF_ENDING: Final = frozenset({"p", "li", "dt", "dd", "option", "tr", "td", "th"})
#: How far down the open elements a self-ending element is looked for.
_SELF_ENDING_REACH: Final = 8


class _HtmlText(HTMLParser):
    """The text of an HTML page as a reader sees it, one line per block, by a streaming walk
    (see the module docstring); the open elements are a stack, bounded in depth."""

    def __init__(self, label: str, bounds: ReadBounds, sink: TextSink) -> None:
        super().__init__(convert_charrefs=True)
        self.label = label
        self.bounds = bounds
        self.sink = sink
        self.open: list[str] = []
        self.hidden = 0
        self.tags = 0
        self.line: list[str] = []
        self.lines: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._count()
        if tag == "body" and "head" in self.open:  # a page that never closed its head
            self._close("head")
        if tag in _BLOCKS:
            self._break()
        if tag in _VOID:
            return
        if tag in _SELF_ENDING and tag in self.open[-_SELF_ENDING_REACH:]:
            self._close(tag)
        self.open.append(tag)
        if tag in _HIDDEN:
            self.hidden += 1
        if len(self.open) > MAX_HTML_DEPTH:
            raise FileRefused(f"{self.label}: HTML nests deeper than {MAX_HTML_DEPTH} elements")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._count()
        if tag in _BLOCKS:
            self._break()

    def handle_endtag(self, tag: str) -> None:
        self._count()
        if tag in self.open:
            self._close(tag)
        if tag in _BLOCKS:
            self._break()

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.line.append(data)

    def _count(self) -> None:
        self.tags += 1
        if self.tags > self.bounds.max_tags:
            raise _too_many_tags(self.label, self.bounds)

    def _close(self, tag: str) -> None:
        """Pop the open elements down to the last *tag*, inclusive."""
        while self.open:
            top = self.open.pop()
            if top in _HIDDEN:
                self.hidden -= 1
            if top == tag:
                return

    def _break(self) -> None:
        if not self.line:
            return
        text = " ".join("".join(self.line).split())
        self.line.clear()
        if text:
            self.lines.append(text)
            if len(self.lines) >= _BATCH:
                self.flush()

    def flush(self) -> None:
        self.sink.add("\n".join(self.lines))
        self.lines.clear()


def read_html(label: str, data: bytes, bounds: ReadBounds, sink: TextSink) -> None:
    """The text of an HTML page (its encoding sniffed as a browser would: BOM, ``<meta>``,
    else UTF-8 or Windows-1252)."""
    from bs4.dammit import UnicodeDammit

    markup = UnicodeDammit(data, is_html=True).unicode_markup
    if markup is None:
        raise FileRefused(f"{label}: unreadable HTML (no encoding decodes it)")
    walk = _HtmlText(label, bounds, sink)
    for start in range(0, len(markup), _CHUNK):
        walk.feed(markup[start : start + _CHUNK])
    walk.close()
    walk._break()
    walk.flush()


# -- PDF ---------------------------------------------------------------------------------------


def read_pdf(label: str, data: bytes, sink: TextSink) -> None:
    """The text of a PDF, page by page (an encrypted one is refused unless its password is
    empty)."""
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise FileRefused(f"{label}: the PDF is encrypted with a password")
        pages = reader.pages
        count = len(pages)
    except (FileRefused, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - a parser's any failure is a bad file
        raise FileRefused(f"{label}: corrupt PDF ({short_error(exc)})") from None
    for number in range(count):
        try:
            text = pages[number].extract_text() or ""
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - a parser's any failure is a bad file
            problem = short_error(exc)
            raise FileRefused(f"{label}: corrupt PDF page {number + 1} ({problem})") from None
        sink.add(text)


# -- Office ------------------------------------------------------------------------------------


def count_tags(label: str, data: bytes, bounds: ReadBounds, skip: Callable[[str], bool]) -> int:
    """The tags (``<``) of the zip's XML members but those *skip* names, counted from their
    bytes a chunk at a time; :class:`FileTooLarge` past ``bounds.max_tags``. (In XML text a
    ``<`` is always escaped, so each one opens a tag, a comment or a declaration.)"""
    tags = 0
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            if skip(info.filename) or not info.filename.endswith((".xml", ".rels")):
                continue
            with archive.open(info) as member:
                while chunk := member.read(_CHUNK):
                    tags += chunk.count(b"<")
                    if tags > bounds.max_tags:
                        raise _too_many_tags(label, bounds)
    return tags


def read_office(label: str, fmt: str, data: bytes, bounds: ReadBounds, sink: TextSink) -> None:
    """The text of a ``docx``, ``pptx`` or ``xlsx`` file (its zip directory already checked
    against the unpacked-size limit)."""
    try:
        count_tags(label, data, bounds, _STREAMED[fmt])
        for piece in _OFFICE[fmt](label, io.BytesIO(data), bounds):
            sink.add(piece)
    except (FileRefused, FileTooLarge, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - a parser's any failure is a bad file
        raise FileRefused(f"{label}: corrupt {fmt} file ({short_error(exc)})") from None


def _batches(lines: Iterator[str]) -> Iterator[str]:
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= _BATCH:
            yield "\n".join(batch)
            batch = []
    if batch:
        yield "\n".join(batch)


def _docx(label: str, stream: io.BytesIO, bounds: ReadBounds) -> Iterator[str]:
    import docx
    from docx.oxml.ns import qn

    document = docx.Document(stream)
    paragraph, text = qn("w:p"), qn("w:t")

    def cell_text(tc: object) -> str:
        """A cell's text, once, whatever columns it spans (its paragraphs, nested tables'
        included, a line each)."""
        return "\n".join(
            "".join(t.text or "" for t in p.iter(text))
            for p in tc.iter(paragraph)  # type: ignore[attr-defined]
        ).strip()

    def lines() -> Iterator[str]:
        for item in document.paragraphs:
            yield item.text
        for table in document.tables:
            for tr in table._tbl.tr_lst:
                yield " | ".join(cell_text(tc) for tc in tr.tc_lst)

    yield from _batches(lines())


def _pptx(label: str, stream: io.BytesIO, bounds: ReadBounds) -> Iterator[str]:
    from pptx import Presentation

    for number, slide in enumerate(Presentation(stream).slides, 1):
        texts = [f"Slide {number}"]
        for shape in slide.shapes:
            if getattr(shape, "has_text_frame", False):
                texts.append(shape.text_frame.text)
            if getattr(shape, "has_table", False):
                for tr in shape.table._tbl.tr_lst:
                    texts.append(" | ".join(_pptx_cell(tc) for tc in tr.tc_lst))
        yield "\n".join(t for t in texts if t.strip())


def _pptx_cell(tc: object) -> str:
    """A slide table cell's text, once (a merged cell is one ``a:tc``)."""
    from pptx.oxml.ns import qn

    return "".join(t.text or "" for t in tc.iter(qn("a:t"))).strip()  # type: ignore[attr-defined]


def _xlsx(label: str, stream: io.BytesIO, bounds: ReadBounds) -> Iterator[str]:
    from openpyxl import load_workbook

    workbook = load_workbook(stream, read_only=True, data_only=True)
    scanned = 0
    try:
        for sheet in workbook.worksheets:
            sheet.reset_dimensions()  # the declared size is ignored (see the module docstring)

            def rows(sheet: object = sheet) -> Iterator[str]:
                nonlocal scanned
                yield f"Sheet {sheet.title}"  # type: ignore[attr-defined]
                for row in sheet.iter_rows(values_only=True):  # type: ignore[attr-defined]
                    scanned += max(1, len(row))  # a missing row costs a step too
                    if scanned > bounds.max_cells:
                        raise FileTooLarge(
                            f"{label}: more than {bounds.max_cells} cells scanned "
                            "(HEED_FILE_MAX_CELLS)"
                        )
                    cells = [str(c) for c in row if c is not None and str(c).strip()]
                    if cells:
                        yield "\t".join(cells)

            yield from _batches(rows())
    finally:
        workbook.close()


_OFFICE: Final[dict[str, Callable[[str, io.BytesIO, ReadBounds], Iterator[str]]]] = {
    "docx": _docx,
    "pptx": _pptx,
    "xlsx": _xlsx,
}
#: Members whose tags are not counted first: a spreadsheet's sheets, which openpyxl streams
#: (their cells are counted instead).
_STREAMED: Final[dict[str, Callable[[str], bool]]] = {
    "docx": lambda name: False,
    "pptx": lambda name: False,
    "xlsx": lambda name: name.startswith("xl/worksheets/"),
}
