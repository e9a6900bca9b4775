"""Untrusted bytes → text or an image block, with every size bounded before it is spent.

Runs inside a parse worker (bot/media/parse_pool.py), never on the event loop: a reader may still
be slow or hungry on a hostile file, and the worker's CPU, memory and wall-clock limits end
it. The bounds here keep honest files cheap and make most bombs fail fast:

* zip members: the uncompressed size from the central directory is checked before a member
  is opened (zipfile stops at that size, so a lying header only truncates);
* XML is walked as a stream of events (no nested ``iter()``), elements cleared as they end;
  extraction stops once the text cap is reached;
* xlsx shared strings: a cap on their number and total size; cells are counted;
* PDF: a page cap, pages sharing a content stream already read are skipped, a run of pages
  without text stops the walk;
* images: the pixel count is checked from the header before anything is decoded; Pillow's
  DecompressionBombWarning is an error.

Failures are ``Refused(reason, detail, cause)`` — plain args, so it pickles across the pipe.
"""

from __future__ import annotations

import base64
import codecs
import io
import zipfile
from xml.etree import ElementTree

MAX_FILE_CHARS = 30_000                # of one file's text into one turn (~10k tokens)
MAX_SIDE_PX = 1568                     # see bot/media/attachments.py
SMALL_IMAGE_BYTES = 1024 * 1024
MAX_PIXELS = 40_000_000                # decoded, 40 MP is ~160 MB of RGBA: past it, refused unread
MAX_MEMBER_BYTES = 32 * 1024 * 1024    # one zip member, uncompressed (a 300-page docx is ~10 MB)
MAX_ZIP_READ = 96 * 1024 * 1024        # all members read from one file, uncompressed
MAX_SHARED_STRINGS = 200_000
MAX_SHARED_CHARS = 4_000_000
MAX_CELLS = 1_000_000
MAX_PDF_PAGES = 200
MAX_EMPTY_PAGES = 30                   # this many pages in a row without text: a scan, stop
CHUNK = 64 * 1024

IMAGE_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}
OFFICE_EXTS = frozenset({"docx", "pptx", "xlsx"})


class Refused(Exception):
    """Could not be read: ``reason`` (a key of bot.media.attachments.REASONS, what the user is told),
    ``detail`` (for the log), ``cause`` (which bound or failure: the log's ``cause``)."""

    def __init__(self, reason: str, detail: str = "", cause: str = "parser") -> None:
        super().__init__(reason, detail, cause)
        self.reason, self.detail, self.cause = reason, detail, cause


class _Full(Exception):
    """The text cap is reached: stop reading."""


class _Text:
    """Collected text, bounded by ``cap`` characters; ``add`` raises _Full past it."""

    def __init__(self, cap: int) -> None:
        self.parts: list[str] = []
        self.left = cap
        self.cut = False

    def add(self, s: str) -> None:
        if not s:
            return
        if len(s) > self.left:
            self.parts.append(s[:self.left])
            self.left = 0
            self.cut = True
            raise _Full
        self.parts.append(s)
        self.left -= len(s)

    def text(self) -> str:
        return "".join(self.parts)


def ext_of(name: str) -> str:
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


# -- files ------------------------------------------------------------------------------------

def read_file(name: str, data: bytes, cap: int = MAX_FILE_CHARS) -> tuple[str, bool]:
    """(text, cut): at most ``cap`` characters of the file's readable text."""
    ext = ext_of(name)
    out = _Text(cap)
    try:
        if ext == "pdf":
            _pdf(data, out)
        elif ext in OFFICE_EXTS:
            _office(ext, data, out)
        else:
            out.add(_decode(data, cap))
    except _Full:
        pass
    text = out.text()
    return (text.rstrip("\n") if ext in OFFICE_EXTS else text), out.cut


def _decode(data: bytes, cap: int) -> str:
    """Only as many bytes as ``cap`` characters can take (4 per character at most)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    head = data[:cap * 4 + 4]
    final = len(head) == len(data)
    for enc in ("utf-8", "gb18030"):   # Chinese Windows tools still write GBK
        try:
            return codecs.getincrementaldecoder(enc)().decode(head, final=final)
        except UnicodeDecodeError:
            continue
    return head.decode("utf-8", errors="replace")


def _pdf(data: bytes, out: _Text) -> None:
    if not data.lstrip()[:5] == b"%PDF-":
        raise Refused("not_pdf", "no %PDF- header")
    from pypdf import PdfReader
    from pypdf.errors import LimitReachedError, PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise Refused("unreadable", "encrypted PDF", "encrypted")
        seen: set = set()
        empty = 0
        first = True
        for i, page in enumerate(reader.pages):
            if i >= MAX_PDF_PAGES:
                out.cut = True
                break
            key = _contents_key(page)
            if key is not None and key in seen:
                continue           # the same content stream as an earlier page: read once
            if key is not None:
                seen.add(key)
            t = page.extract_text() or ""
            if not t.strip():
                empty += 1
                if empty >= MAX_EMPTY_PAGES:
                    break
                continue
            empty = 0
            out.add(t if first else "\n\n" + t)
            first = False
    except (Refused, _Full):
        raise
    except LimitReachedError as e:    # pypdf's own bounds (inflated size, cycles, depth)
        raise Refused("unreadable", f"LimitReachedError: {e}"[:200], "limit") from e
    except PyPdfError as e:
        raise Refused("not_pdf", f"{type(e).__name__}: {e}"[:200]) from e
    except (ValueError, KeyError, TypeError, OSError, AttributeError, IndexError, RecursionError,
            AssertionError, ZeroDivisionError, UnicodeError, ArithmeticError) as e:
        raise Refused("not_pdf", f"{type(e).__name__}: {e}"[:200]) from e


def _contents_key(page) -> tuple | None:
    """The indirect references of a page's /Contents (None when inline or absent)."""
    try:
        raw = page.get("/Contents")
        refs = raw if isinstance(raw, list) else [raw]
        key = tuple((r.idnum, r.generation) for r in refs if hasattr(r, "idnum"))
        return key or None
    except Exception:  # noqa: BLE001 - odd structure: no dedup, the page is read as usual
        return None


_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
_S = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"


class _Zip:
    """Members opened only after their declared (enforced) uncompressed size is checked."""

    def __init__(self, z: zipfile.ZipFile) -> None:
        self.z = z
        self.read = 0

    def events(self, name: str, tags: tuple[str, ...]):
        """(tag, element) at the end of each element named in ``tags``, streamed; every
        element is cleared after its end (the caller has read it by then)."""
        info = self.z.getinfo(name)
        if info.file_size > MAX_MEMBER_BYTES:
            raise Refused("unreadable", f"{name}: {info.file_size} bytes uncompressed", "member_size")
        self.read += info.file_size
        if self.read > MAX_ZIP_READ:
            raise Refused("unreadable", f"{self.read} bytes uncompressed in all", "zip_total")
        parser = ElementTree.XMLPullParser(events=("end",))
        with self.z.open(info) as f:
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                parser.feed(chunk)
                for _, el in parser.read_events():
                    if el.tag in tags:
                        yield el.tag, el
                    el.clear()
            parser.close()
            for _, el in parser.read_events():
                if el.tag in tags:
                    yield el.tag, el
                el.clear()


def _office(ext: str, data: bytes, out: _Text) -> None:
    """docx / pptx / xlsx are zipped XML: their text is in a few known parts."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            zr = _Zip(z)
            names = z.namelist()
            if ext == "docx":
                _docx(zr, out)
            elif ext == "pptx":
                _pptx(zr, names, out)
            else:
                _xlsx(zr, names, out)
    except (Refused, _Full):
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, ElementTree.ParseError, ValueError,
            EOFError, OSError, NotImplementedError, RuntimeError, RecursionError, UnicodeError) as e:
        # RuntimeError: an encrypted member; NotImplementedError: an unknown compression method
        raise Refused("unreadable", f"{ext}: {type(e).__name__}: {e}"[:200]) from e


def _docx(zr: _Zip, out: _Text) -> None:
    started = False
    for tag, el in zr.events("word/document.xml", (f"{_W}t", f"{_W}p")):
        if tag == f"{_W}t":
            out.add(el.text or "")
            started = True
        elif started:
            out.add("\n")


def _pptx(zr: _Zip, names: list[str], out: _Text) -> None:
    slides = sorted((n for n in names if n.startswith("ppt/slides/slide") and n.endswith(".xml")),
                    key=lambda n: int("".join(c for c in n if c.isdigit()) or 0))
    for i, n in enumerate(slides, 1):
        out.add(("\n\n" if i > 1 else "") + f"# slide {i}")
        para: list[str] = []
        plen = 0
        for tag, el in zr.events(n, (f"{_A}t", f"{_A}p")):
            if tag == f"{_A}t":
                para.append(el.text or "")
                plen += len(para[-1])
                if plen > out.left:       # one huge paragraph fills the cap: no need for the rest
                    out.add("\n" + "".join(para))
            elif plen:
                out.add("\n" + "".join(para))
                para, plen = [], 0


def _xlsx(zr: _Zip, names: list[str], out: _Text) -> None:
    shared: list[str] = []
    if "xl/sharedStrings.xml" in names:
        total, cur = 0, []
        for tag, el in zr.events("xl/sharedStrings.xml", (f"{_S}t", f"{_S}si")):
            if tag == f"{_S}t":
                cur.append(el.text or "")
                continue
            s = "".join(cur)[:MAX_FILE_CHARS]
            cur = []
            total += len(s)
            if len(shared) >= MAX_SHARED_STRINGS or total > MAX_SHARED_CHARS:
                raise Refused("unreadable", f"shared strings past {len(shared)} / {total} chars", "shared_strings")
            shared.append(s)
    cells = 0
    first_row = True
    sheets = sorted(x for x in names if x.startswith("xl/worksheets/sheet") and x.endswith(".xml"))
    for n in sheets:
        row: list[str] = []
        width = 0
        inline: list[str] = []
        for tag, el in zr.events(n, (f"{_S}v", f"{_S}t", f"{_S}c", f"{_S}row")):
            if tag == f"{_S}t":
                inline.append(el.text or "")
            elif tag == f"{_S}v":
                inline.append(el.text or "")
            elif tag == f"{_S}c":
                cells += 1
                if cells > MAX_CELLS:
                    out.cut = True
                    raise _Full
                val = "".join(inline)
                inline = []
                if el.get("t") == "s":
                    val = shared[int(val)] if val.isdigit() and int(val) < len(shared) else ""
                row.append(val)
                width += len(val) + 1
                if width > out.left:      # this row alone fills the cap: stop here
                    out.add(("" if first_row else "\n") + "\t".join(row))
            else:
                out.add(("" if first_row else "\n") + "\t".join(row))
                first_row = False
                row, width = [], 0


# -- images -----------------------------------------------------------------------------------

def sniff_image(data: bytes) -> str:
    """The image format from its first bytes ('' when none we send): the name or the
    transport's content type is not trusted — a wrong media_type is a 400 from the model."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return ""


def read_image(data: bytes) -> dict:
    """An ImageBlock: small images exactly as received; large ones (bytes or pixels) decoded
    and re-encoded as JPEG within MAX_SIDE_PX. Refused("not_image" / "too_many_pixels")."""
    import warnings

    fmt = sniff_image(data)
    if not fmt:
        raise Refused("not_image", "unknown magic bytes")
    from PIL import Image, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                w, h = img.size
                if w * h > MAX_PIXELS:          # from the header: nothing decoded yet
                    raise Refused("too_many_pixels", f"{w}x{h}", "pixels")
                img.verify()        # the structure: a truncated or forged file fails here
            with Image.open(io.BytesIO(data)) as img:
                if len(data) <= SMALL_IMAGE_BYTES and max(w, h) <= MAX_SIDE_PX:
                    return {"type": "image", "media_type": IMAGE_TYPES[fmt],
                            "data": base64.b64encode(data).decode("ascii")}
                if fmt == "jpeg":
                    img.draft("RGB", (MAX_SIDE_PX, MAX_SIDE_PX))   # decode at a reduced scale
                img.thumbnail((MAX_SIDE_PX, MAX_SIDE_PX))
                rgb = img.convert("RGB")
                buf = io.BytesIO()
                rgb.save(buf, format="JPEG", quality=85, optimize=True)
    except Refused:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise Refused("too_many_pixels", str(e)[:200], "pixels") from e
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, TypeError, KeyError,
            IndexError, struct_error(), ZeroDivisionError) as e:
        raise Refused("not_image", f"{type(e).__name__}: {e}"[:200]) from e
    return {"type": "image", "media_type": "image/jpeg", "data": base64.b64encode(buf.getvalue()).decode("ascii")}


def struct_error():
    import struct
    return struct.error
