"""Small real files built at test time: PDF (by hand, a few hundred bytes a page), docx,
pptx and xlsx (by the libraries heed reads them with), a zip bomb, bad UTF-8."""

from __future__ import annotations

import io
import zipfile


def pdf(pages: list[str]) -> bytes:
    """A valid PDF whose pages show *pages* (one line each, Helvetica), with a real xref."""
    objects: list[bytes] = []
    n = len(pages)
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(n))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode())
    font_id = 3 + 2 * n
    for i, text in enumerate(pages):
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode()
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 {font_id} 0 R >> >> /Contents {4 + 2 * i} 0 R >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for offset in offsets:
        out.write(f"{offset:010d} 00000 n \n".encode())
    out.write(
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    return out.getvalue()


def docx(paragraphs: list[str]) -> bytes:
    import docx as python_docx

    document = python_docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def pptx(slides: list[str]) -> bytes:
    from pptx import Presentation
    from pptx.util import Inches

    presentation = Presentation()
    for text in slides:
        slide = presentation.slides.add_slide(presentation.slide_layouts[6])
        box = slide.shapes.add_textbox(Inches(1), Inches(1), Inches(6), Inches(1))
        box.text_frame.text = text
    out = io.BytesIO()
    presentation.save(out)
    return out.getvalue()


def xlsx(rows: list[list[str]]) -> bytes:
    from openpyxl import Workbook

    workbook = Workbook()
    sheet = workbook.active
    sheet.title = "Pets"
    for row in rows:
        sheet.append(row)
    out = io.BytesIO()
    workbook.save(out)
    return out.getvalue()


def zip_bomb_docx(unpacked_bytes: int) -> bytes:
    """A .docx-shaped zip whose one member inflates to *unpacked_bytes* zeros."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr("word/document.xml", b"\0" * unpacked_bytes)
    return out.getvalue()


BAD_UTF8 = b"Alice likes tea.\n" + b"\xff\xfe broken"


# -- bombs: a few kilobytes whose parse would follow what they declare -----------------------


def _rezipped(data: bytes, change: dict[str, bytes]) -> bytes:
    """*data* (a zip) with the members named in *change* replaced."""
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(data)) as source,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        for info in source.infolist():
            target.writestr(info.filename, change.get(info.filename, source.read(info)))
    return out.getvalue()


def xlsx_dimension_bomb(last_row: int) -> bytes:
    """An .xlsx whose sheet declares ``A1:XFD<last_row>`` (16,384 columns) and holds two
    cells: one in A1, one at column XFD of row *last_row*."""
    sheet = (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
        '<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
        f'<dimension ref="A1:XFD{last_row}"/><sheetData>'
        '<row r="1"><c r="A1" t="inlineStr"><is><t>Pets</t></is></c></row>'
        f'<row r="{last_row}"><c r="XFD{last_row}" t="inlineStr"><is><t>Yak</t></is></c></row>'
        "</sheetData></worksheet>"
    )
    return _rezipped(xlsx([["x"]]), {"xl/worksheets/sheet1.xml": sheet.encode()})


def _docx_body(body: str) -> bytes:
    xml = (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
        '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
        f"<w:body>{body}</w:body></w:document>"
    )
    return _rezipped(docx(["x"]), {"word/document.xml": xml.encode()})


def docx_gridspan_bomb(span: int) -> bytes:
    """A .docx with one paragraph and a one-cell table whose cell spans *span* columns."""
    return _docx_body(
        "<w:p><w:r><w:t>Olive keeps bees.</w:t></w:r></w:p>"
        f'<w:tbl><w:tr><w:tc><w:tcPr><w:gridSpan w:val="{span}"/></w:tcPr>'
        "<w:p><w:r><w:t>Hive</w:t></w:r></w:p></w:tc></w:tr></w:tbl>"
    )


def docx_paragraph_bomb(paragraphs: int) -> bytes:
    """A .docx of *paragraphs* empty paragraphs and one with text."""
    return _docx_body("<w:p/>" * paragraphs + "<w:p><w:r><w:t>End.</w:t></w:r></w:p>")


def html_nested(depth: int, text: str = "x") -> bytes:
    """``<div>`` x *depth*, then *text*: no tag closed."""
    return b"<div>" * depth + text.encode()


#: A file whose text must never reach a memory (the XXE tests name it).
XXE_TARGET = "/etc/hostname"


def _doctype(root: str, entities: str) -> str:
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE {root} [{entities}]>\n'


def docx_xxe() -> bytes:
    """A .docx whose text is an external entity naming a local file."""
    xml = _doctype("w:document", f'<!ENTITY leak SYSTEM "file://{XXE_TARGET}">') + (
        '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
        "<w:body><w:p><w:r><w:t>Before &leak; after</w:t></w:r></w:p></w:body></w:document>"
    )
    return _rezipped(docx(["x"]), {"word/document.xml": xml.encode()})


def _laughs(levels: int = 9) -> str:
    entities = ['<!ENTITY l0 "lol">']
    entities += [f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, levels + 1)]
    return "".join(entities)


def docx_billion_laughs() -> bytes:
    """A .docx whose text is ten levels of entities of ten (a billion 'lol's)."""
    xml = _doctype("w:document", _laughs()) + (
        '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
        "<w:body><w:p><w:r><w:t>Laugh: &l9;</w:t></w:r></w:p></w:body></w:document>"
    )
    return _rezipped(docx(["x"]), {"word/document.xml": xml.encode()})


def xlsx_billion_laughs() -> bytes:
    """An .xlsx whose sheet's one cell is a billion 'lol's by entities."""
    sheet = _doctype("worksheet", _laughs()) + (
        '<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
        '<sheetData><row r="1"><c r="A1" t="inlineStr"><is><t>&l9;</t></is></c></row>'
        "</sheetData></worksheet>"
    )
    return _rezipped(xlsx([["x"]]), {"xl/worksheets/sheet1.xml": sheet.encode()})


def html_billion_laughs() -> bytes:
    """An HTML page with the entities of a billion laughs (HTML has no DTD entities)."""
    return (f"<!DOCTYPE html [{_laughs()}]><p>Laugh: &l9;</p>").encode()
