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

from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

from bot.media import readers
from bot.core.inbound import Attachment, Inbound, Material
from bot.media.parse_pool import ParseFailed, ParsePool
from bot.media.stt import SpeechError, Transcriber, transcript_cap

MAX_IMAGE_BYTES = 10 * 1024 * 1024     # Lark's own cap on an image message
MAX_FILE_BYTES = 20 * 1024 * 1024      # past this a file's text is rarely what was meant
MAX_AUDIO_BYTES = 25 * 1024 * 1024     # OpenAI's transcription upload limit (Groq's too)
MAX_FILE_CHARS = readers.MAX_FILE_CHARS   # of one file's text into one turn (~10k tokens)
MAX_IMAGES = 4                         # per message (a post can carry many)
# Anthropic's guidance: images past ~1.15 megapixels / 1568 px are downscaled by the API anyway
# (same tokens, more upload); OpenAI's "high" detail tiles at 2048/768. 1568 px suits both.
# (bot/media/readers.py MAX_SIDE_PX; small and within it: sent exactly as received.)
TEXT_EXTS = frozenset({"txt", "md", "markdown", "csv", "tsv", "json", "log", "yaml", "yml", "xml",
                       "html", "htm", "py", "js", "ts", "go", "java", "c", "h", "cpp", "rs", "sh",
                       "sql", "ini", "toml", "rst"})
OFFICE_EXTS = readers.OFFICE_EXTS


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
    "unreadable": ("这个{what}我读不了（可能已损坏、加密，或者太复杂）。",
                   "I couldn't read that {what_en} (it may be damaged, encrypted or too complex)."),
    "too_many_pixels": ("这张图片的像素太多了（上限 4000 万像素），我读不了。可以缩小一点再发吗？",
                        "That image has too many pixels for me (limit 40 megapixels). Could you send a smaller one?"),
    "unsupported": ("抱歉，我还读不了 {ext} 文件。目前支持：文本、Markdown、PDF、Word(docx)、PowerPoint(pptx)、Excel(xlsx)。",
                    "Sorry, I can't read {ext} files yet. I can read text, Markdown, PDF, Word (docx), PowerPoint (pptx) and Excel (xlsx)."),
    "too_long": ("这条语音太长了（上限 {limit}），我听不了。可以分成几条短一点的吗？",
                 "That voice message is too long for me (limit {limit_en}). Could you send shorter ones?"),
    "no_speech": ("这条语音里我没听出说了什么，可以再说一次或者打字告诉我吗？",
                  "I couldn't make out any words in that voice message — could you say it again or type it?"),
    "stt_unreachable": ("抱歉，语音识别服务暂时不可用，稍后再发一次试试，或者打字告诉我？",
                        "Sorry, speech recognition is unavailable just now — try again later, or type it?"),
    "stt_refused": ("抱歉，语音识别服务没有接受这条语音，可以打字告诉我吗？",
                    "Sorry, the speech recognition service did not accept that voice message — could you type it?"),
    # The parse pool's queue (bot/media/parse_pool.py): this sender's own files fill it, or everyone's.
    "busy": ("我还在读你之前发的文件，这个{what}先放下了，请等一会儿再发一次。",
             "I'm still reading the files you sent before — please send this {what_en} again in a moment."),
    "overloaded": ("我这会儿要读的文件太多了，请过一会儿再发一次这个{what}。",
                   "I have too many files to read just now — please send this {what_en} again in a little while."),
    "stt_too_long": ("语音识别服务返回的文字远远超出这条语音能说的长度，我没有采用。可以再发一次或者打字告诉我吗？",
                     "The speech recognition service returned far more text than that voice message could hold, so I didn't use it — could you send it again or type it?"),
    "no_text": ("这个文件里没有我能读出的文字（可能是扫描件）。", "I found no text in that file (a scan, perhaps)."),
}
_WHAT = {"image": ("图片", "image"), "file": ("文件", "file"), "forward": ("合并转发的消息", "forwarded bundle"),
         "audio": ("语音", "voice message")}
_CAPS = {"image": MAX_IMAGE_BYTES, "audio": MAX_AUDIO_BYTES}


def refusal(reason: str, kind: str, *, chinese: bool = True, ext: str = "", limit_s: float = 0) -> str:
    zh, en = REASONS.get(reason, REASONS["unreadable"])
    what, what_en = _WHAT.get(kind, ("文件", "file"))
    cap = _mb(_CAPS.get(kind, MAX_FILE_BYTES))
    minutes = f"{limit_s / 60:g}"
    return (zh if chinese else en).format(what=what, what_en=what_en, cap=cap, ext=ext or "this kind of",
                                          limit=f"{minutes} 分钟", limit_en=f"{minutes} min")


def _mb(n: int) -> str:
    return f"{n // (1024 * 1024)} MB"


@dataclass(frozen=True, slots=True)
class Fetched:
    data: bytes = b""
    media_type: str = ""
    material: tuple[Material, ...] = ()   # a forwarded bundle's children (the transport's)


Fetch = Callable[[Inbound, Attachment], Awaitable[Fetched]]


@dataclass
class Prepared:
    """The turn's extra content: image blocks for the model, references to append to the
    user's words (``[文件 file a.pdf]``), and the third-party text itself as ``material``
    (a file's text, a forward's children) — fenced as data, never the user's own words."""

    images: list[dict] = field(default_factory=list)
    text: str = ""
    material: list[Material] = field(default_factory=list)
    cut: bool = False
    image_bytes: int = 0
    skipped: list = field(default_factory=list)   # AttachmentErrors of a post's images (logged)
    transcript: str = ""      # a voice message's words: answered as if typed, shown in the reply
    audio_seconds: float = 0.0


async def prepare(inbound: Inbound, fetch: Fetch, *, vision: bool, pool: ParsePool,
                  stt: "Transcriber | None" = None) -> Prepared:
    """Fetch and read every attachment; raises AttachmentError on the first that fails (the
    message is answered with the reason and nothing of it is stored). The bytes are read in
    ``pool``'s worker processes (bot/media/parse_pool.py): nothing untrusted is parsed on the loop,
    and a parser's error, a timeout, a memory or CPU limit is an AttachmentError too."""
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
                block = await _read(pool, "image", got.data, kind="image", key=inbound.sender_id)
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
            text, cut = await _read(pool, "file", att.name, got.data, MAX_FILE_CHARS, kind="file",
                                    key=inbound.sender_id)
            if not text.strip():
                raise AttachmentError("no_text", att.name, kind="file")
            if cut:
                out.cut = True
                parts.append(f"[文件 file {att.name} — 只读了前 {MAX_FILE_CHARS} 字 / first {MAX_FILE_CHARS} characters only]")
            else:
                parts.append(f"[文件 file {att.name}]")
            out.material.append(Material("file", source=att.name, text=text))
        elif att.kind == "forward":
            got = await fetch(inbound, att)
            budget = MAX_FILE_CHARS
            for m in got.material:
                if budget <= 0:
                    out.cut = True
                    break
                if len(m.text) > budget:
                    m = replace(m, text=m.text[:budget])
                    out.cut = True
                budget -= len(m.text)
                out.material.append(m)
            parts.append(f"[合并转发 forwarded messages — {len(got.material)} 条 / messages]")
        elif att.kind == "audio" and stt is not None:     # without: the polite answer, as before
            await _transcribe(inbound, att, fetch, pool, stt, out)
    out.text = "\n\n".join(parts)
    return out


_ext = readers.ext_of


async def _transcribe(inbound: Inbound, att: Attachment, fetch: Fetch, pool: ParsePool,
                      stt: "Transcriber", out: Prepared) -> None:
    """A voice message's words, or AttachmentError (too long, undecodable, no words, the STT
    server down): the user hears why, nothing is stored. The declared duration is checked
    before the download, the measured one (parse worker) before the upload."""
    limit = stt.max_seconds
    if att.seconds > limit:
        raise AttachmentError("too_long", f"{att.seconds:g} s declared", kind="audio", limit_s=limit)
    if att.size and att.size > MAX_AUDIO_BYTES:
        raise AttachmentError("too_large", f"{att.size} bytes", kind="audio")
    got = await fetch(inbound, att)
    if len(got.data) > MAX_AUDIO_BYTES:
        raise AttachmentError("too_large", f"{len(got.data)} bytes", kind="audio")
    info = await _read(pool, "audio", got.data, kind="audio", key=inbound.sender_id)
    seconds = max(float(info["seconds"]), att.seconds)
    if seconds > limit:
        raise AttachmentError("too_long", f"{seconds:.1f} s", kind="audio", limit_s=limit)
    cap = transcript_cap(seconds)
    try:
        text = await stt.transcribe(got.data, filename=f"voice.{info['ext']}", media_type=info["media_type"],
                                    max_chars=cap)
    except SpeechError as e:
        raise AttachmentError(f"stt_{e.reason}", e.detail, kind="audio", status=e.status,
                              seconds=round(seconds, 1), max_chars=cap) from None
    text = text.strip()
    if not text:
        raise AttachmentError("no_speech", f"{seconds:.1f} s", kind="audio")
    out.transcript = text
    out.audio_seconds = seconds


# -- reading: in the parse pool --------------------------------------------------------------

async def _read(pool: "ParsePool", job: str, *args, kind: str, key: str = "") -> object:
    """A reader's result from a parse worker; AttachmentError for every way it can fail.
    ``key`` is the sender: the pool is fair between senders (bot/media/parse_pool.py)."""
    try:
        return await pool.run(job, *args, key=key)
    except ParseFailed as e:
        # Refused for the queue: the line names whose files fill it (the operator's next question).
        who = {"user_id": key} if e.cause in ("sender_queue", "queue_full") else {}
        raise AttachmentError(e.reason, e.detail, kind=kind, cause=e.cause, **who) from None


async def read_image(pool: "ParsePool", data: bytes, *, key: str = "") -> dict:
    """An image block for ``data`` (see bot/media/readers.py read_image), read in the pool on behalf
    of ``key`` (the sender)."""
    return await _read(pool, "image", data, kind="image", key=key)


sniff_image = readers.sniff_image
