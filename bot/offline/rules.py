"""What the built-in offline model answers: deterministic rules, no model.

Answers are deterministic (same request, same answer) and every chat answer starts with
``[offline] ``. The Messages API server that serves them is ``bot/offline/server.py``; reading
the request (content blocks, the system prompt's sections, the user's own words) is
``bot/offline/prompt.py``. Apart from the wire so the rules can be read, changed and tested
without HTTP.

What it does (in this order):

1. **Consolidation requests** (the consolidator's three shapes):
   a forced tool call (``tool_choice={"type": "tool", "name": ...}``), structured outputs
   (``output_config.format`` ``json_schema``), or a plain request whose system prompt asks for
   one JSON object for ``write_summary`` / ``extract_memories``.
   ``write_summary`` → an extractive summary: the first sentence of each user line (speaker
   named when there are several), truncated; ``extract_memories`` → facts found in the user's
   lines by patterns (我是/我叫/我在/我喜欢/我决定…, I am/I work/I live/I like/I prefer/I
   decided…) with a category and an importance (0.95 when the line says 记住/remember), and in
   companion mode ``profile_psych`` entries for lines about feelings.
2. **After a tool_result**: a short confirmation of what the tool did (or why it failed).
3. **A chat message** (the last user turn):
   a stated rule (以后/从现在起/今后…, from now on/always/never…) → ``procedure_write``;
   "我叫X" / "my name is X" / "I'm X, …" → ``profile_update`` (基础特征, merge; the name only);
   「记住…」/「记一下…」/"remember …" → ``memory_write`` with a category by keywords
   (喜欢/prefer → preference, 决定/decide → decision, 不对/其实/actually/纠正 → correction,
   else knowledge); otherwise a deterministic answer that shows what memory gave it: the
   top facts from ``<memory_context>`` ("我记得：…"), the rules from
   ``<behavioral_guidelines>``, the name from ``<user_profile>``, recalled episodes, whether a
   ``[对话摘要]``/``[长期记忆]`` was replayed — and echoes the question. A rule asking for
   English or Chinese answers switches its language.

Tools are only called when the request offers them. Any odd input (system as a string or a
list of blocks, content as a string or blocks, unknown block types, missing fields) gets an
answer; an internal error becomes a short text answer, never a 500. Only a body that is not a
JSON object gets the API's 400 ``invalid_request_error``.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from bot.core.text import is_chinese
from bot.offline.prompt import (_blocks, _clip, _label_split, _last_user_text, _text_of, _tool_names,
                                _volatile_context, first_sentence, memory_episodes, memory_facts,
                                memory_rules, profile_name, system_text)

MARK = "[offline] "
SUMMARY_TOOL = "write_summary"
EXTRACT_TOOL = "extract_memories"
MAX_SUMMARY_CHARS = 600


# --------------------------------------------------------------------------------------
# Consolidation: summaries and extraction
# --------------------------------------------------------------------------------------

_TRANSCRIPT_LINE = re.compile(r"^\[([^\]\n]{1,80})\]:\s?(.*)$")


def summarise(text: str) -> str:
    """Extractive summary of what users said (the consolidator's transcript or summaries)."""
    text = (text or "").replace(MARK, "")
    user_lines: list[tuple[str, str]] = []
    other: list[str] = []
    in_transcript = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _TRANSCRIPT_LINE.match(line)
        if m:
            in_transcript = True
            if m.group(1).lower() != "assistant":
                user_lines.append((m.group(1), m.group(2)))
            continue
        if in_transcript:
            continue        # a later line of a multi-line message: the first sentence is enough
        line = line.removeprefix("- ")
        if line.endswith((":", "：")):
            continue        # a heading such as "Transcript:"
        other.append(line)
    parts: list[str] = []
    if user_lines:
        speakers = {who for who, _ in user_lines}
        for who, said in user_lines:
            s = first_sentence(said).rstrip("。.；;")
            if not s:
                continue
            parts.append(f"{who}: {s}" if len(speakers) > 1 else s)
        # an earlier summary given as context goes first, shortened, and only with what the
        # new lines do not already say (summaries of summaries must not repeat each other)
        context = [p for p in _sentences(" ".join(o for o in other if o)) if p not in parts]
        if context:
            parts.insert(0, _clip("；".join(dict.fromkeys(context)), 160).rstrip("。.；;"))
    else:
        for line in other:
            for s in _sentences(line):
                parts.append(_clip(s, 160))
    seen: set[str] = set()
    unique = [p for p in parts if not (p in seen or seen.add(p))]
    sep = "；" if is_chinese(" ".join(unique)) else "; "
    summary = sep.join(unique) or "(nothing to summarise)"
    return _clip(summary, MAX_SUMMARY_CHARS)


def _sentences(text: str) -> list[str]:
    """The pieces of an (extractive) summary: what ；/; /。 separate."""
    return [p.strip().rstrip("。.；;") for p in re.split(r"[；;。\n]|(?<=\.)\s", text or "")
            if p.strip().rstrip("。.；;")]


def _third_person_zh(text: str) -> str:
    return re.sub(r"我(?!们)", "用户", text)


_EN_SUBJECT = {"i'm": "the user is", "i am": "the user is", "i was": "the user was", "i've": "the user has",
               "i have": "the user has", "i'd": "the user would", "i'll": "the user will"}
_MODALS = {"can", "will", "would", "should", "must", "may", "might", "could", "did", "was", "is", "had",
           "cannot", "can't", "won't", "didn't", "shall"}
_IRREGULAR = {"have": "has", "do": "does", "go": "goes", "don't": "doesn't", "am": "is", "are": "is"}


def _third_person_en(text: str) -> str:
    t = text.strip()
    low = t.lower()
    for k, v in _EN_SUBJECT.items():
        if low.startswith(k + " "):
            t = v + t[len(k):]
            break
    else:
        m = re.match(r"(?i)^i\s+(\S+)(.*)$", t)
        if m:
            verb, rest = m.group(1), m.group(2)
            lv = verb.lower()
            if lv in _IRREGULAR:
                verb = _IRREGULAR[lv]
            elif lv not in _MODALS and re.fullmatch(r"[a-z]+", lv):
                if re.search(r"(s|sh|ch|x|z|o)$", lv):
                    verb += "es"
                elif re.search(r"[^aeiou]y$", lv):
                    verb = verb[:-1] + "ies"
                else:
                    verb += "s"
            t = f"the user {verb}{rest}"
    t = re.sub(r"(?i)\bmy\b", "the user's", t)
    t = re.sub(r"(?i)\b(me|myself)\b", "the user", t)
    return t[:1].upper() + t[1:]


def third_person(text: str) -> str:
    text = text.strip().rstrip("。.！!")
    return _third_person_zh(text) if is_chinese(text) else _third_person_en(text)


def category_of(text: str) -> str:
    t = text.lower()
    if re.search(r"不对|纠正|更正|其实|说错|搞错|\bactually\b|\bcorrection\b|\bwrong\b|\bi meant\b", t):
        return "correction"
    if re.search(r"决定|打算|选了|定了|\bdecid|\bchose\b|\bgoing with\b", t):
        return "decision"
    if re.search(r"喜欢|偏好|爱吃|爱喝|讨厌|不爱|\bprefer|\blike\b|\blikes\b|\blove\b|\bhate\b|\bfavou?rite\b", t):
        return "preference"
    return "knowledge"


_STRONG = re.compile(r"记住|记一下|记下|别忘|一定|\bremember\b|\bdon't forget\b|\balways\b|\bnever\b", re.I)

# (pattern, category or None = by keywords); each captures the whole clause about the user
_EXTRACT_PATTERNS: list[tuple[re.Pattern[str], str | None]] = [
    (re.compile(r"我(?:叫|是|在|住在|来自|负责|做|喜欢|爱|偏好|更喜欢|讨厌|不喜欢|决定|打算|养了|有)[^，。！？,.!?;；\n]{1,60}"), None),
    (re.compile(r"\bI(?:'m| am| work| live| like| love| prefer| hate| decided| use| have| own| study)\b[^,.!?;\n]{1,80}", re.I), None),
    (re.compile(r"\bmy (?:name|job|role|team|favou?rite \w+) is [^,.!?;\n]{1,60}", re.I), None),
]
_QUESTION = re.compile(r"[?？]\s*$|^(?:我是不是|我是否|我能不能|我可以|我该|我要不要)")
_FEELINGS = re.compile(
    r"压力|焦虑|难过|伤心|开心|高兴|累|担心|害怕|孤独|烦|失眠|紧张|委屈|生气|"
    r"\b(?:stressed|anxious|sad|worried|tired|lonely|afraid|scared|happy|upset|overwhelmed|nervous)\b", re.I)


_EXISTING = re.compile(r"^- #(\d+): (.*)$")


def _decide(fact: dict[str, Any], existing: list[tuple[int, str]]) -> dict[str, Any]:
    """The extraction contract's decision against the user's existing facts, as a model would
    make it: the same fact → reinforce; a contradiction or a correction → update that fact."""
    from memory.facts.matching import CONTRADICTS, SAME_FACT, corrected_fact, relation

    for fid, old in existing:
        kind = relation(fact["content"], old, category=fact["category"])
        if kind == SAME_FACT:
            return {**fact, "action": "reinforce", "target_id": fid}
        if kind == CONTRADICTS:
            return {**fact, "action": "update", "target_id": fid}
    if fact["category"] == "correction" and existing:
        target = corrected_fact(fact["content"], existing)
        if target is not None:
            return {**fact, "action": "update", "target_id": target}
    return {**fact, "action": "add", "target_id": 0}


def extract(text: str, *, companion: bool) -> dict[str, Any]:
    """Facts (and, in companion mode, profile_psych entries) from the user's lines, each with
    its decision against the existing facts listed after "Existing facts" (add / reinforce /
    update / contradict + target_id)."""
    existing: list[tuple[int, str]] = []
    text, _, known = (text or "").partition("Existing facts (id: text):")
    for raw in known.splitlines():
        if m := _EXISTING.match(raw.strip()):
            existing.append((int(m.group(1)), m.group(2)))
    lines: list[str] = []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if line.startswith("- "):
            lines.append(line[2:].strip())
        elif (m := _TRANSCRIPT_LINE.match(line)) and m.group(1).lower() != "assistant":
            lines.append(m.group(2))
    facts: list[dict[str, Any]] = []
    psych: list[dict[str, str]] = []
    seen: set[str] = set()
    for line in lines:
        if not line or _QUESTION.search(line) or is_question(line):
            continue
        for pattern, category in _EXTRACT_PATTERNS:
            for m in pattern.finditer(line):
                clause = m.group(0).strip()
                content = third_person(clause)
                if len(content) < 3 or content in seen:
                    continue
                seen.add(content)
                cat = category or ("correction" if category_of(line) == "correction" else category_of(clause))
                facts.append({"content": content, "category": cat,
                              "importance": 0.95 if _STRONG.search(line) else 0.8})
        if companion and _FEELINGS.search(line):
            entry = ("用户提到：" if is_chinese(line) else "The user mentioned: ") + first_sentence(line)
            if entry not in seen:
                seen.add(entry)
                psych.append({"entry": entry})
    return {"facts": [_decide(f, existing) for f in facts[:10]], "profile_psych": psych[:5]}


def _structured_tool(body: dict) -> str:
    """Which consolidation output is asked for ('' when none)."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "tool" and choice.get("name") in (SUMMARY_TOOL, EXTRACT_TOOL):
        return str(choice["name"])
    return ""


def _structured_format(body: dict) -> str:
    cfg = body.get("output_config")
    fmt = cfg.get("format") if isinstance(cfg, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        props = (fmt.get("schema") or {}).get("properties") or {}
        if "facts" in props or "profile_psych" in props:
            return EXTRACT_TOOL
        return SUMMARY_TOOL
    system = system_text(body.get("system"))
    m = re.search(r"one JSON object only.*\((write_summary|extract_memories)\)", system, re.DOTALL)
    return m.group(1) if m else ""


def consolidation_output(kind: str, body: dict) -> dict[str, Any]:
    system = system_text(body.get("system"))
    user = "\n".join(_text_of(m.get("content")) for m in body.get("messages") or []
                     if isinstance(m, dict) and m.get("role") == "user")
    if kind == SUMMARY_TOOL:
        return {"summary": summarise(user)}
    companion = "Also fill profile_psych" in system
    return extract(user, companion=companion)


# --------------------------------------------------------------------------------------
# Chat
# --------------------------------------------------------------------------------------

_REMEMBER_ZH = re.compile(r"(?:请|麻烦)?(?:帮我)?(?:记住|记一下|记下来|记下|记着)[：:，,。\s]*(.*)$", re.DOTALL)
_REMEMBER_EN = re.compile(r"(?i)\b(?:please\s+)?(?:remember|note|make a note)(?:\s+that)?[:,]?\s+(.*)$", re.DOTALL)
_RULE_TRIGGER_ZH = re.compile(r"以后|从现在起|从现在开始|从今以后|今后|每次都|永远不要|再也不要")
_RULE_VERB_ZH = re.compile(r"回复|回答|用|叫我|称呼|说|写|不要|别|请|给我|输出|格式|加上|带上")
_RULE_EN = re.compile(
    r"(?i)\b(?:from now on|going forward|in (?:the )?future)\b"
    r"|^(?:please\s+)?(?:always|never|don't ever)\b"
    r"|\byou (?:should |must )?(?:always|never)\b")
# A Chinese name runs until punctuation or the clause that follows it ("我叫王磊在支付组"); an
# English one is one word, plus a second only when capitalised (case-sensitive: "Alice and"
# is not a surname), and "I'm"/"I am" take only a capitalised word that ends the clause
# ("I'm Bob, …", never "I'm Happy to help").
_ZH_NAME_END = r"(?=[\s，。！？,.!?；;、]|在|是|来自|负责|做|从事|今年|住|目前|现在|$)"
_EN_NAME = r"([A-Za-z][\w'-]*(?: (?!I\b)[A-Z][\w'-]*)?)"
_NAME = [
    re.compile(r"我(?:的名字)?叫([^\s，。！？,.!?；;、]{1,20}?)" + _ZH_NAME_END),
    re.compile(r"我的名字是([^\s，。！？,.!?；;、]{1,20}?)" + _ZH_NAME_END),
    re.compile(r"\b(?i:my name is|i'm called) " + _EN_NAME),
    re.compile(r"\b(?:I'm|I am|(?i:this is)) ([A-Z][a-z'-]+)(?=\s*(?:[,.!;，。]|$|\s(?:and|from|here)\b))"),
]


_ASKING = re.compile(
    r"[?？]\s*$|什么|哪|谁|几|多少|怎么|是否|是不是|有没有|[吗呢么嘛]\s*[。!！]?\s*$"
    r"|(?i:^\s*(?:what|who|whom|where|when|why|how|which|do|does|did|is|are|am|can|could|would|will|have|has)\b)")


def is_question(text: str) -> bool:
    """A question never writes memory: "我叫什么名字？" is not a name, "你记住了吗？" no fact."""
    return bool(_ASKING.search((text or "").strip()))


def plan_tool(text: str, tools: set[str]) -> tuple[str, dict] | None:
    """The memory tool a chat message calls for, if any (none for a question)."""
    t = text.strip()
    if is_question(t):
        return None
    zh = is_chinese(t)
    body, remember = t, False
    if m := (_REMEMBER_ZH.search(t) if zh else None) or _REMEMBER_EN.search(t):
        body, remember = m.group(1).strip(), True
    if "procedure_write" in tools and (
            (zh and _RULE_TRIGGER_ZH.search(t) and _RULE_VERB_ZH.search(t)) or (not zh and _RULE_EN.search(t))):
        rule = body.strip().rstrip("。.!！") or t
        return "procedure_write", {"rule": rule, "context": "用户明确要求" if zh else "the user asked for it"}
    for pattern in _NAME:
        if nm := pattern.search(t):
            name = nm.group(1).strip()
            if "profile_update" in tools:
                entry = f"名字：{name}" if zh else f"Name: {name}"
                return "profile_update", {"section": "基础特征", "entry": entry, "mode": "merge"}
            if "memory_write" in tools:
                return "memory_write", {"content": f"用户叫{name}" if zh else f"The user's name is {name}",
                                        "category": "knowledge"}
    if remember and "memory_write" in tools:
        if not body.strip("。.!！ "):
            return None
        return "memory_write", {"content": third_person(body), "category": category_of(t)}
    return None


def _language(question: str, rules: list[str]) -> str:
    for r in reversed(rules):
        if re.search(r"英文|英语|(?i:\benglish\b)", r):
            return "en"
        if re.search(r"中文|汉语|(?i:\bchinese\b)", r):
            return "zh"
    return "zh" if is_chinese(question) else "en"


def chat_answer(question: str, system: str, messages: list[dict], speaker: str = "") -> str:
    facts = memory_facts(system)
    rules = memory_rules(system)
    episodes = memory_episodes(system)
    name = profile_name(system)
    replay = [_text_of(m.get("content")) for m in messages[:4] if isinstance(m, dict)]
    has_summary = any(r.startswith("[对话摘要]") for r in replay)
    has_long = any(r.startswith("[长期记忆]") for r in replay)
    lang = _language(question, rules)
    q = _clip(question, 120)
    who = name or speaker
    lines: list[str] = []
    if lang == "zh":
        lines.append((f"{who}，" if who else "") + f"你说：「{q}」")
        if facts:
            lines.append("我记得：" + "；".join(_clip(f, 60) for f in facts[:3]) + "。")
        else:
            lines.append("关于你，我还没有记住什么。说「记住 …」我就会记下来。")
        if rules:
            lines.append("我会遵守的规则：" + "；".join(_clip(r, 60) for r in rules[:3]) + "。")
        if episodes:
            lines.append("想起之前聊过：" + _clip(episodes[0], 80))
        if has_summary or has_long:
            parts = [p for p, on in (("对话摘要", has_summary), ("长期记忆", has_long)) if on]
            lines.append(f"（我也读到了{'和'.join(parts)}。）")
        lines.append("（这是内置的离线模型；设置 ANTHROPIC_API_KEY 后由 Claude 回答。）")
    else:
        lines.append((f"{who}, " if who else "") + f"you said: \u201c{q}\u201d")
        if facts:
            lines.append("What I remember: " + "; ".join(_clip(f, 60) for f in facts[:3]) + ".")
        else:
            lines.append("I don't remember anything about you yet. Say \u201cremember …\u201d and I will.")
        if rules:
            lines.append("Rules I follow: " + "; ".join(_clip(r, 60) for r in rules[:3]) + ".")
        if episodes:
            lines.append("We talked about this before: " + _clip(episodes[0], 80))
        if has_summary or has_long:
            parts = [p for p, on in (("the conversation summary", has_summary), ("long-term memory", has_long)) if on]
            lines.append(f"(I also read {' and '.join(parts)}.)")
        lines.append("(This is the built-in offline model; set ANTHROPIC_API_KEY to answer with Claude.)")
    return MARK + "\n".join(lines)


def confirmation(messages: list[dict], lang: str) -> str:
    """A short answer after the tool results: what was saved, or why not."""
    uses: dict[str, dict] = {}
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant":
            for b in _blocks(m.get("content"), "tool_use"):
                uses[str(b.get("id", ""))] = b
    results = _blocks(messages[-1].get("content"), "tool_result") if messages else []
    lines = []
    for r in results:
        use = uses.get(str(r.get("tool_use_id", "")), {})
        name, args = use.get("name", ""), use.get("input") if isinstance(use.get("input"), dict) else {}
        detail = _clip(_text_of(r.get("content")) if not isinstance(r.get("content"), str) else r["content"], 160)
        if r.get("is_error"):
            lines.append(f"没能保存：{detail}" if lang == "zh" else f"I couldn't save that: {detail}")
        elif name == "memory_write":
            c = _clip(str(args.get("content", "")), 100)
            lines.append(f"好的，我记住了：{c}" if lang == "zh" else f"Got it, I'll remember: {c}")
        elif name == "procedure_write":
            c = _clip(str(args.get("rule", "")), 100)
            lines.append(f"好的，以后我会遵守：{c}" if lang == "zh" else f"OK, from now on: {c}")
        elif name == "profile_update":
            c = _clip(str(args.get("entry", "")), 100)
            s = args.get("section", "")
            lines.append(f"好的，已更新你的画像（{s}）：{c}" if lang == "zh"
                         else f"OK, I updated your profile ({s}): {c}")
        else:
            lines.append(f"完成：{detail}" if lang == "zh" else f"Done: {detail}")
    if not lines:
        lines.append("好的。" if lang == "zh" else "OK.")
    return MARK + "\n".join(lines)


# --------------------------------------------------------------------------------------
# One request → content blocks
# --------------------------------------------------------------------------------------

def respond(body: dict) -> tuple[list[dict], str]:
    """(content blocks, stop_reason) for one Messages API request."""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()
    tool_id = f"toolu_offline_{digest[:20]}"

    kind = _structured_tool(body)
    if kind:
        return [{"type": "tool_use", "id": tool_id, "name": kind, "input": consolidation_output(kind, body)}], "tool_use"
    kind = _structured_format(body)
    if kind:
        out = consolidation_output(kind, body)
        return [{"type": "text", "text": json.dumps(out, ensure_ascii=False)}], "end_turn"

    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    system = system_text(body.get("system"))
    context = _volatile_context(messages)
    if context:
        system += "\n\n" + context       # read like the system prompt's blocks (same fencing)
    rules = memory_rules(system)
    if messages and messages[-1].get("role") == "user" and _blocks(messages[-1].get("content"), "tool_result"):
        speaker, question = _label_split(_last_user_text(messages))
        return [{"type": "text", "text": confirmation(messages, _language(question, rules))}], "end_turn"

    raw = _last_user_text(messages[-1:]) if messages and messages[-1].get("role") == "user" else ""
    speaker, question = _label_split(raw.strip())
    if not question:
        return [{"type": "text", "text": MARK + "我在。有什么可以帮你的？ / I'm here."}], "end_turn"
    if not question.startswith(("[长期记忆]", "[对话摘要]")):
        planned = plan_tool(question, _tool_names(body))
        if planned is not None:
            name, args = planned
            return [{"type": "tool_use", "id": tool_id, "name": name, "input": args}], "tool_use"
    return [{"type": "text", "text": chat_answer(question, system, messages, speaker)}], "end_turn"


