"""Hostile files, generated (issue 32): small on the wire, huge or slow once parsed. Nothing
large is stored in the repository; each builder takes well under a second."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
S_NS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"


def _zip(members: dict[str, bytes | str]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return out.getvalue()


def nested_paragraph_docx(depth: int = 20_000) -> bytes:
    """``depth`` paragraphs each inside the last: a nested ``iter()`` walks it in O(depth²)."""
    body = ("<w:p>" * depth) + "<w:r><w:t>nested</w:t></w:r>" + ("</w:p>" * depth)
    doc = f'<?xml version="1.0"?><w:document xmlns:w="{W_NS}"><w:body>{body}</w:body></w:document>'
    return _zip({"word/document.xml": doc})


def big_member_docx(mb: int = 64) -> bytes:
    """A document.xml of ``mb`` MiB uncompressed (one enormous run of text), ~100 KB zipped."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("word/document.xml", "w", force_zip64=True) as f:
            f.write(f'<w:document xmlns:w="{W_NS}"><w:body><w:p><w:r><w:t>'.encode())
            chunk = b"A" * (1024 * 1024)
            for _ in range(mb):
                f.write(chunk)
            f.write(b"</w:t></w:r></w:p></w:body></w:document>")
    return out.getvalue()


def shared_string_xlsx(cells: int = 20_000, string_chars: int = 1_000_000) -> bytes:
    """One shared string of ``string_chars`` used by ``cells`` cells: ~1 MB zipped, expanded
    ``cells`` × ``string_chars`` characters (20 000 × 1 M = 20 G)."""
    shared = (f'<sst xmlns="{S_NS}" count="1" uniqueCount="1"><si><t>' + "字" * string_chars
              + "</t></si></sst>")
    row_cells = "".join(f'<c r="A{i}" t="s"><v>0</v></c>' for i in range(1, 2))
    rows = "".join(f'<row r="{i}">{row_cells}</row>' for i in range(1, cells + 1))
    sheet = f'<worksheet xmlns="{S_NS}"><sheetData>{rows}</sheetData></worksheet>'
    return _zip({"xl/sharedStrings.xml": shared, "xl/worksheets/sheet1.xml": sheet,
                 "xl/workbook.xml": f'<workbook xmlns="{S_NS}"/>'})


def pdf_file(objs: list[bytes]) -> bytes:
    """A PDF of ``objs`` (object 1 the catalog), xref offsets exact."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def _stream(data: bytes) -> bytes:
    packed = zlib.compress(data, 9)
    return b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed) + packed + b"\nendstream"


_FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
_PAGE = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R /Resources << /Font << /F1 4 0 R >> >> >>"


def textless_pdf(pages: int = 100, ops: int = 15_000, *, shared: bool = True) -> bytes:
    """``pages`` pages sharing one content stream of ``ops`` empty text operators: each page's
    text extraction walks the whole stream (0.3–1.5 s on the shared test machine), and finds
    nothing (~17 KB; 30–150 s for the old page loop).
    ``shared=False``: a stream of its own per page (no reader can skip one as seen)."""
    streams = 1 if shared else pages
    first_page = 4 + streams
    kids = b" ".join(b"%d 0 R" % (first_page + i) for i in range(pages))
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages), _FONT]
    objs += [_stream(b"BT /F1 12 Tf () Tj ET\n" * ops + b"%% %d\n" % i) for i in range(streams)]
    objs += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R"
             b" /Resources << /Font << /F1 3 0 R >> >> >>" % (4 + (0 if shared else i)) for i in range(pages)]
    return pdf_file(objs)


def limit_pdf(mb: int = 80) -> bytes:
    """A page whose content stream inflates past pypdf's 75 MB limit: LimitReachedError."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [5 0 R] /Count 1 >>",
            _stream(b" " * (mb * 1024 * 1024)), _FONT, _PAGE]
    return pdf_file(objs)


def huge_png(w: int = 12_000, h: int = 12_000) -> bytes:
    """A valid w×h RGB PNG of zeros, compressed row by row (~420 KB at 12 000²)."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    comp = zlib.compressobj(9)
    row = b"\0" * (1 + w * 3)
    idat = bytearray()
    for _ in range(h):
        idat += comp.compress(row)
    idat += comp.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", bytes(idat)) + chunk(b"IEND", b""))


BOMBS = {   # name -> (file name, builder); the images go as image messages
    "nested_docx": ("nested.docx", nested_paragraph_docx),
    "textless_pdf": ("scan.pdf", textless_pdf),
    "shared_xlsx": ("sheet.xlsx", shared_string_xlsx),
    "big_member_docx": ("big.docx", big_member_docx),
    "huge_png": ("huge.png", huge_png),
    "limit_pdf": ("limit.pdf", limit_pdf),
}
