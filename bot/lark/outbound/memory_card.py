"""The /memory card: what Ethan knows about the user, each item with where and when it was
learned and Forget / Correct buttons, governed by the user in the chat (issue 31 ★).

``memory_card(view)`` renders a ``bot.commands.memory.MemoryView`` (JSON 2.0, ``update_multi`` so the
click's outcome replaces it for everyone who sees it). Each button's value names the item and
the card's owner: ``{"ethan": "memory", "op": …, "kind": …, "id": …, "user": owner,
"chat_type": …}`` — a claim only: the card ledger (memory/sessions/chat_events.py, recorded once Lark took
the card) decides the owner and the chat type. Only the owner's click acts (bot/commands/memory_clicks.py,
via bot/core/lifecycle.py); another user's click, a card the ledger does not know, or a value that
disagrees with it changes nothing (refused at intake with a toast, bot/lark/card_clicks.py).
The buttons run the typed commands
(``bot.commands.memory.forget_command`` / ``correct_command``) — the same code path as ``/forget`` and
``/correct`` typed in the chat — so the console and the terminal, which get the text, keep
working without cards.

Correct opens the item in an edit view (``edit_card``): a form (a card may hold forms only at its
root) with one input holding the current text and a Save button; its submit carries the typed
text in ``action.form_value["text"]``. Save supersedes a fact (the old one kept as history),
rewrites a profile line, replaces a rule; the card then shows the list again, with the outcome.
"""

from __future__ import annotations

from typing import Any

from bot.lark.outbound.cards import summary_of

MEMORY = "memory"                 # the buttons' "ethan" value
OPS = ("forget", "correct", "save", "back")
INPUT_NAME = "text"
MAX_LISTED_BELOW = 40            # then listed by id and text only
MAX_CARD_ITEMS = 15               # with buttons (~1 KB of JSON each); the rest listed: under ~30 KB
MAX_INPUT_CHARS = 500


def _value(op: str, item: Any, owner: str, chat_type: str) -> dict[str, Any]:
    v: dict[str, Any] = {"ethan": MEMORY, "op": op, "user": owner, "chat_type": chat_type}
    if item is not None:
        v.update(kind=item.kind, id=int(item.id))
    return v


def _button(label: str, style: str, value: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"tag": "button", "text": {"tag": "plain_text", "content": label}, "type": style,
            "size": "small", "behaviors": [{"type": "callback", "value": value}], **extra}


def _md(text: str) -> str:
    # The item's text is data: no tag or <at> it holds may act (mentions, fonts, links by tag).
    from bot.lark.outbound.render import defuse_mentions

    return defuse_mentions(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def memory_card(view: Any, *, chat_type: str, notice: str = "") -> dict[str, Any]:
    """The list with a Forget and a Correct button per item (``view``: bot.commands.memory.MemoryView)."""
    zh = view.zh
    title = "我记住的关于你 / What I know about you" if zh else "What I know about you"
    elements: list[dict[str, Any]] = []
    if notice:
        elements.append({"tag": "markdown", "content": f"**{_md(notice)}**"})
    if not view.items:
        elements.append({"tag": "markdown", "content": _md(str(view))})
    shown = view.items[:MAX_CARD_ITEMS]
    for it in shown:
        ref = {"fact": f"#{it.id}", "profile": f"profile {it.id}", "rule": f"rule {it.id}"}[it.kind]
        elements.append({"tag": "markdown", "content":
                         f"**{ref}** [{_md(it.label)}] {_md(it.text[:160])}\n<font color='grey'>{_md(it.learned)}</font>"})
        elements.append({"tag": "column_set", "columns": [
            {"tag": "column", "width": "auto", "elements": [
                _button("忘记 Forget" if zh else "Forget", "danger", _value("forget", it, view.owner, chat_type))]},
            {"tag": "column", "width": "auto", "elements": [
                _button("更正 Correct" if zh else "Correct", "default", _value("correct", it, view.owner, chat_type))]},
        ]})
    rest = view.items[MAX_CARD_ITEMS:MAX_CARD_ITEMS + MAX_LISTED_BELOW]
    more = view.more + len(view.items) - MAX_CARD_ITEMS - len(rest) if len(view.items) > MAX_CARD_ITEMS else view.more
    if rest:     # beyond the buttons' room: listed with their ids for the typed commands
        refs = {"fact": "#{}", "profile": "profile {}", "rule": "rule {}"}
        elements.append({"tag": "markdown", "content": "\n".join(
            f"{refs[it.kind].format(it.id)} {_md(it.text[:40])}" for it in rest)})
    if more:
        elements.append({"tag": "markdown", "content": f"…还有 {more} 条" if zh else f"…and {more} more"})
    if view.note:
        elements.append({"tag": "markdown", "content": _md(view.note)})
    elements.append({"tag": "markdown", "content": "<font color='grey'>" + (
        "只有你本人可以点这些按钮。也可以输入 /forget <id> 或 /correct <id> <新内容>。" if zh else
        "Only you can press these buttons. You can also type /forget <id> or /correct <id> <new text>.")
        + "</font>"})
    return {
        "schema": "2.0",
        "config": {"update_multi": True, "summary": {"content": summary_of(notice or title)}},
        "header": {"title": {"tag": "plain_text", "content": title}, "template": "blue"},
        "body": {"elements": elements},
    }


def edit_card(view: Any, item: Any, *, chat_type: str) -> dict[str, Any]:
    """One item in an edit form: its text in an input, Save (submits the text) and Back."""
    zh = view.zh
    save = _button("保存 Save" if zh else "Save", "primary_filled", _value("save", item, view.owner, chat_type),
                   name=f"save_{item.kind}_{item.id}", form_action_type="submit")
    back = _button("返回 Back" if zh else "Back", "default", _value("back", None, view.owner, chat_type))
    head = (f"更正 {item.kind} {item.id}：输入新的内容后保存（旧的记忆会保留为历史）" if zh
            else f"Correct {item.kind} {item.id}: type the new text and save (a fact's old text is kept as history)")
    return {
        "schema": "2.0",
        "config": {"update_multi": True, "summary": {"content": summary_of(head)}},
        "header": {"title": {"tag": "plain_text", "content": "更正 / Correct" if zh else "Correct"},
                   "template": "orange"},
        "body": {"elements": [
            {"tag": "markdown", "content": f"{_md(head)}\n\n> {_md(item.text)}"},
            {"tag": "form", "name": "correct_form", "elements": [
                {"tag": "input", "name": INPUT_NAME, "required": True, "max_length": MAX_INPUT_CHARS,
                 "default_value": item.text[:MAX_INPUT_CHARS],
                 "placeholder": {"tag": "plain_text", "content": "新的内容 / new text"}},
                save,
            ]},
            back,
        ]},
    }
