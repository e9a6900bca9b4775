"""What came with a message besides text — images, files, a forwarded bundle — turned into
what the model reads: image blocks (``memory.llm.ImageBlock``) and text.

Transport-neutral: the transport only fetches (``Fetch``: the bytes of an image or file, the
flattened text of a forwarded bundle) and says why it could not (``AttachmentError``). The
checks — size caps, is this really a PNG / a PDF, how much text fits — are made here once,
for every interface.

History keeps a reference, never the bytes: the user's stored text says ``[图片 image
img_v3_…]`` / ``[文件 file report.pdf]`` plus the file's extracted text, and the model's
answer that follows describes the image; a replay reads those, it does not re-send megabytes.
"""

from __future__ import annotations

import base64
import io
import zipfile
from dataclasses import dataclass, field
from typing import Awaitable, Callable
from xml.etree import ElementTree

from bot.inbound import Attachment, Inbound

MAX_IMAGE_BYTES = 10 * 1024 * 1024     # Lark's own cap on an image message
MAX_FILE_BYTES = 20 * 1024 * 1024      # past this a file's text is rarely what was meant
MAX_FILE_CHARS = 30_000                # of one file's text into one turn (~10k tokens)
MAX_IMAGES = 4                         # per message (a post can carry many)
# Anthropic's guidance: images past ~1.15 megapixels / 1568 px are downscaled by the API anyway
# (same tokens, more upload); OpenAI's "high" detail tiles at 2048/768. 1568 px suits both.
MAX_SIDE_PX = 1568
SMALL_IMAGE_BYTES = 1024 * 1024        # small and within MAX_SIDE_PX: sent exactly as received

IMAGE_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}
TEXT_EXTS = frozenset({"txt", "md", "markdown", "csv", "tsv", "json", "log", "yaml", "yml", "xml",
                       "html", "htm", "py", "js", "ts", "go", "java", "c", "h", "cpp", "rs", "sh",
                       "sql", "ini", "toml", "rst"})
OFFICE_EXTS = frozenset({"docx", "pptx", "xlsx"})


class AttachmentError(Exception):
    """An attachment could not be read. ``reason`` is one of REASONS (what the user is told);
    ``fields`` go on the log line (the transport's codes)."""

    def __init__(self, reason: str, detail: str = "", **fields: object) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.fields = fields


REASONS = {
    "too_large": ("{what}太大了（上限 {cap}），我读不了。可以压缩一下或者只发需要的部分吗？",
                  "That {what_en} is too large for me (limit {cap}). Could you send a smaller one?"),
    "unreachable": ("抱歉，我暂时取不到这个{what}（飞书那边出错了），稍后再发一次试试？",
                    "Sorry, I couldn't fetch that {what_en} from Lark just now — please try again later."),
    "forbidden": ("抱歉，我没有读取这个{what}的权限（需要管理员为应用开通 im:message:readonly 权限）。",
                  "Sorry, I'm not allowed to read that {what_en} (the app needs the im:message:readonly scope)."),
    "not_image": ("这个图片的格式我认不出来（支持 PNG、JPEG、GIF、WebP）。",
                  "I couldn't recognise that image's format (PNG, JPEG, GIF and WebP work)."),
    "not_pdf": ("这个文件名是 .pdf，但内容不是有效的 PDF，我读不了。",
                "That file is named .pdf but isn't a valid PDF, so I can't read it."),
    "unreadable": ("这个文件我打不开（可能已损坏或加密）。", "I couldn't open that file (it may be damaged or encrypted)."),
    "unsupported": ("抱歉，我还读不了 {ext} 文件。目前支持：文本、Markdown、PDF、Word(docx)、PowerPoint(pptx)、Excel(xlsx)。",
                    "Sorry, I can't read {ext} files yet. I can read text, Markdown, PDF, Word (docx), PowerPoint (pptx) and Excel (xlsx)."),
    "no_text": ("这个文件里没有我能读出的文字（可能是扫描件）。", "I found no text in that file (a scan, perhaps)."),
}
_WHAT = {"image": ("图片", "image"), "file": ("文件", "file"), "forward": ("合并转发的消息", "forwarded bundle")}


def refusal(reason: str, kind: str, *, chinese: bool = True, ext: str = "") -> str:
    zh, en = REASONS.get(reason, REASONS["unreadable"])
    what, what_en = _WHAT.get(kind, ("文件", "file"))
    cap = _mb(MAX_IMAGE_BYTES if kind == "image" else MAX_FILE_BYTES)
    return (zh if chinese else en).format(what=what, what_en=what_en, cap=cap, ext=ext or "this kind of")


def _mb(n: int) -> str:
    return f"{n // (1024 * 1024)} MB"


@dataclass(frozen=True, slots=True)
class Fetched:
    data: bytes = b""
    media_type: str = ""
    text: str = ""             # a forwarded bundle, already flattened by the transport


Fetch = Callable[[Inbound, Attachment], Awaitable[Fetched]]


@dataclass
class Prepared:
    """The turn's extra content: image blocks for the model, text to append to the user's
    words (stored in history too), notes for the user about what was cut."""

    images: list[dict] = field(default_factory=list)
    text: str = ""
    cut: bool = False
    image_bytes: int = 0
    skipped: list = field(default_factory=list)   # AttachmentErrors of a post's images (logged)


async def prepare(inbound: Inbound, fetch: Fetch, *, vision: bool) -> Prepared:
    """Fetch and read every attachment; raises AttachmentError on the first that fails (the
    message is answered with the reason and nothing of it is stored)."""
    out = Prepared()
    parts: list[str] = []
    images = [a for a in inbound.attachments if a.kind == "image"]
    for att in inbound.attachments:
        if att.kind == "image":
            if images.index(att) >= MAX_IMAGES:
                continue
            if not vision:
                parts.append(f"[图片 image {att.ref} — 当前模型不支持看图 / this model cannot see images]")
                continue
            try:
                got = await fetch(inbound, att)
                if len(got.data) > MAX_IMAGE_BYTES:
                    raise AttachmentError("too_large", f"{len(got.data)} bytes", kind="image")
                block = image_block(got.data)
            except AttachmentError as e:
                if inbound.message_type != "post":
                    raise
                # An image inside a rich-text post: its words still get an answer.
                out.skipped.append(e)
                parts.append(f"[图片 image {att.ref} — 无法读取 / could not be read]")
                continue
            out.images.append(block)
            out.image_bytes += len(got.data)
            parts.append(f"[图片 image {att.ref}]")
        elif att.kind == "file":
            ext = _ext(att.name)
            if ext not in TEXT_EXTS and ext not in OFFICE_EXTS and ext != "pdf":
                raise AttachmentError("unsupported", ext or "no extension", kind="file", ext=ext)
            if att.size and att.size > MAX_FILE_BYTES:
                raise AttachmentError("too_large", f"{att.size} bytes", kind="file")
            got = await fetch(inbound, att)
            if len(got.data) > MAX_FILE_BYTES:
                raise AttachmentError("too_large", f"{len(got.data)} bytes", kind="file")
            text = extract_text(att.name, got.data)
            if not text.strip():
                raise AttachmentError("no_text", att.name, kind="file")
            if len(text) > MAX_FILE_CHARS:
                text = text[:MAX_FILE_CHARS]
                out.cut = True
                parts.append(f"[文件 file {att.name} — 只读了前 {MAX_FILE_CHARS} 字 / first {MAX_FILE_CHARS} characters only]\n{text}")
            else:
                parts.append(f"[文件 file {att.name}]\n{text}")
        elif att.kind == "forward":
            got = await fetch(inbound, att)
            text = got.text
            if len(text) > MAX_FILE_CHARS:
                text = text[:MAX_FILE_CHARS]
                out.cut = True
            parts.append(f"[合并转发 forwarded messages]\n{text}")
    out.text = "\n\n".join(parts)
    return out


def _ext(name: str) -> str:
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


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


def image_block(data: bytes) -> dict:
    """An ImageBlock: small images exactly as received; large ones (bytes or pixels) decoded
    and re-encoded as JPEG within MAX_SIDE_PX, which keeps the request small and the model's
    image tokens bounded. Raises AttachmentError("not_image") for anything else."""
    fmt = sniff_image(data)
    if not fmt:
        raise AttachmentError("not_image", "unknown magic bytes", kind="image")
    from PIL import Image, UnidentifiedImageError   # imported on first image: not on every start

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.verify()             # decodes the structure: a truncated or forged file fails here
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
            if len(data) <= SMALL_IMAGE_BYTES and max(w, h) <= MAX_SIDE_PX:
                return {"type": "image", "media_type": IMAGE_TYPES[fmt],
                        "data": base64.b64encode(data).decode("ascii")}
            img.thumbnail((MAX_SIDE_PX, MAX_SIDE_PX))
            rgb = img.convert("RGB")
            buf = io.BytesIO()
            rgb.save(buf, format="JPEG", quality=85, optimize=True)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise AttachmentError("not_image", str(e)[:200], kind="image") from e
    return {"type": "image", "media_type": "image/jpeg", "data": base64.b64encode(buf.getvalue()).decode("ascii")}


# -- files ------------------------------------------------------------------------------------

def extract_text(name: str, data: bytes) -> str:
    """A file's readable text; AttachmentError when it is not what its name says."""
    ext = _ext(name)
    if ext == "pdf":
        return _pdf_text(data)
    if ext in OFFICE_EXTS:
        return _office_text(ext, data)
    return _decode(data)


def _decode(data: bytes) -> str:
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    for enc in ("utf-8", "gb18030"):   # Chinese Windows tools still write GBK
        try:
            return data.decode(enc)
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace")


def _pdf_text(data: bytes) -> str:
    if not data.lstrip()[:5] == b"%PDF-":
        raise AttachmentError("not_pdf", "no %PDF- header", kind="file")
    import logging

    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    logging.getLogger("pypdf").setLevel(logging.ERROR)   # its warnings about odd files are not ours
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise AttachmentError("unreadable", "encrypted PDF", kind="file")
        pages, size = [], 0
        for page in reader.pages:
            t = page.extract_text() or ""
            pages.append(t)
            size += len(t)
            if size > MAX_FILE_CHARS:      # enough to fill the cap: the rest is not read
                break
    except AttachmentError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as e:
        raise AttachmentError("not_pdf", str(e)[:200], kind="file") from e
    return "\n\n".join(pages)


_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
_S = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"


def _office_text(ext: str, data: bytes) -> str:
    """docx / pptx / xlsx are zipped XML: their text is in a few known parts, read with the
    standard library (no dependency for what is a few XPath walks)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = z.namelist()
            if ext == "docx":
                root = ElementTree.fromstring(z.read("word/document.xml"))
                return "\n".join("".join(t.text or "" for t in p.iter(f"{_W}t")) for p in root.iter(f"{_W}p"))
            if ext == "pptx":
                slides = sorted((n for n in names if n.startswith("ppt/slides/slide") and n.endswith(".xml")),
                                key=lambda n: int("".join(c for c in n if c.isdigit()) or 0))
                out = []
                for i, n in enumerate(slides, 1):
                    root = ElementTree.fromstring(z.read(n))
                    paras = ["".join(t.text or "" for t in p.iter(f"{_A}t")) for p in root.iter(f"{_A}p")]
                    out.append(f"# slide {i}\n" + "\n".join(x for x in paras if x))
                return "\n\n".join(out)
            shared = []
            if "xl/sharedStrings.xml" in names:
                root = ElementTree.fromstring(z.read("xl/sharedStrings.xml"))
                shared = ["".join(t.text or "" for t in si.iter(f"{_S}t")) for si in root.iter(f"{_S}si")]
            out = []
            for n in sorted(x for x in names if x.startswith("xl/worksheets/sheet") and x.endswith(".xml")):
                root = ElementTree.fromstring(z.read(n))
                for row in root.iter(f"{_S}row"):
                    cells = []
                    for c in row.iter(f"{_S}c"):
                        v = c.find(f"{_S}v")
                        val = v.text if v is not None else "".join(t.text or "" for t in c.iter(f"{_S}t"))
                        if c.get("t") == "s" and val is not None and val.isdigit() and int(val) < len(shared):
                            val = shared[int(val)]
                        cells.append(val or "")
                    out.append("\t".join(cells))
            return "\n".join(out)
    except (zipfile.BadZipFile, KeyError, ElementTree.ParseError, ValueError) as e:
        raise AttachmentError("unreadable", f"{ext}: {e}"[:200], kind="file") from e
