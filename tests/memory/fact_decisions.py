"""A fact-decision set (issue 19): pairs of facts written one after the other for one user.

``MERGE``: near-duplicates — the second must reinforce the first (one active fact).
``KEEP``: look-alikes — different facts; both must stay active.
``CORRECT``: the second (category ``correction``) corrects the first — the first must be
superseded by it (end time, replaced-by), the correction active.
Each item: (first, first category, second, second category).
"""

from __future__ import annotations

MERGE = [
    ("用户喜欢喝乌龙茶", "preference", "用户很喜欢喝乌龙茶", "preference"),
    ("用户在杭州工作", "knowledge", "用户在杭州工作。", "knowledge"),
    ("用户是一名后端工程师", "knowledge", "用户是后端工程师", "knowledge"),
    ("用户养了一只叫豆豆的柯基", "knowledge", "用户养了一只柯基叫豆豆", "knowledge"),
    ("The user prefers short answers", "preference", "The user prefers short answers.", "preference"),
    ("The user lives in Berlin", "knowledge", "The user lives in Berlin.", "knowledge"),
    ("The user is a vegetarian", "knowledge", "The user is vegetarian", "knowledge"),
    ("The user runs every morning", "knowledge", "The user runs every morning before work", "knowledge"),
    # issue 31: synonyms of naming merge
    ("The user has a dog named Max", "knowledge", "The user has a dog called Max", "knowledge"),
    ("用户的女儿叫小雨", "knowledge", "用户女儿的名字叫小雨", "knowledge"),
    ("用户的猫叫咪咪", "knowledge", "用户的猫名叫咪咪", "knowledge"),
    ("The user's son is called Leo", "knowledge", "The user's son is named Leo", "knowledge"),
]
KEEP = [
    ("用户收藏了第1号邮票", "knowledge", "用户收藏了第2号邮票", "knowledge"),
    ("用户喜欢喝乌龙茶", "preference", "用户喜欢喝咖啡", "preference"),
    ("用户的女儿叫小雨", "knowledge", "用户的儿子叫小雷", "knowledge"),
    ("用户在杭州工作", "knowledge", "用户的父母住在成都", "knowledge"),
    ("The user has a dog named Max", "knowledge", "The user has a cat named Luna", "knowledge"),
    ("The user likes jazz", "preference", "The user likes hiking", "preference"),
    ("The user's sister lives in Lisbon", "knowledge", "The user's brother lives in Porto", "knowledge"),
    ("The user owns a ThinkPad", "knowledge", "The user owns a Kindle", "knowledge"),
    # issue 31: someone else's attribute is not the user's own
    ("用户的手机号是13800138000", "knowledge", "用户母亲的手机号是13900139000", "knowledge"),
    ("用户住在杭州", "knowledge", "用户的姐姐住在杭州", "knowledge"),
    ("用户的手机号是13800138000", "knowledge", "用户妈妈的手机号是13800138001", "knowledge"),
    ("The user lives in Hangzhou", "knowledge", "Her sister lives in Hangzhou", "knowledge"),
    ("The user's phone number is 555-0100", "knowledge", "The user's mother's phone number is 555-0199", "knowledge"),
    ("用户在阿里巴巴工作", "knowledge", "用户的同事在阿里巴巴工作", "knowledge"),
    ("The user lives in Hangzhou", "knowledge", "The user's sister lives in Hangzhou", "knowledge"),
    ("The user works at Acme", "knowledge", "The user's colleague works at Acme", "knowledge"),
    ("The user is allergic to peanuts", "knowledge", "The user's husband is allergic to peanuts", "knowledge"),
]
# issue 31: a changed number, date or weekday is an update (the first superseded by the second)
# or a distinct fact (both active) — never a silent merge into the first.
CHANGED = [
    ("用户每周三去游泳", "knowledge", "用户每周五去游泳", "knowledge"),
    ("用户的航班是3月5日", "knowledge", "用户的航班是3月7日", "knowledge"),
    ("用户每月房租三千五", "knowledge", "用户每月房租四千", "knowledge"),
    ("The user has yoga every Tuesday", "knowledge", "The user has yoga every Thursday", "knowledge"),
    ("The user's rent is 1200 euros", "knowledge", "The user's rent is 1350 euros", "knowledge"),
    ("The user's dentist appointment is on May 3", "knowledge", "The user's dentist appointment is on May 10", "knowledge"),
]
CORRECT = [
    ("用户在杭州工作", "knowledge", "用户其实不在杭州，在上海工作", "correction"),
    ("用户喜欢喝咖啡", "preference", "用户不喝咖啡了，改喝茶", "correction"),
    ("用户的狗叫豆豆", "knowledge", "用户的狗不叫豆豆，叫团子", "correction"),
    ("用户是前端工程师", "knowledge", "用户不是前端，是后端工程师", "correction"),
    ("用户下周三面试", "knowledge", "用户的面试改到了下周五", "correction"),
    ("The user lives in Berlin", "knowledge", "The user moved from Berlin to Munich", "correction"),
    ("The user's trainer is Marco", "knowledge", "The user's trainer is not Marco but Priya", "correction"),
    ("The user is allergic to peanuts", "knowledge", "Correction: the user is allergic to cashews, not peanuts", "correction"),
    ("The user's marathon goal is 4:00", "knowledge", "The user's marathon goal is now 3:45", "correction"),
    ("The user works at Acme", "knowledge", "The user no longer works at Acme; now at Globex", "correction"),
]


async def score(make_store) -> dict:
    """Write each pair through ``FactStore.add`` (source agent_proactive — what memory_write
    does) for a fresh user; count duplicates, wrong supersessions, corrections that supersede."""
    from memory.scope import Scope

    out = {"duplicates": 0, "look_alikes_lost": 0, "corrections": 0, "corrected": 0,
           "changed": 0, "changed_merged": 0, "failures": []}
    n = 0
    for kind, items in (("merge", MERGE), ("keep", KEEP), ("correct", CORRECT), ("changed", CHANGED)):
        for first, c1, second, c2 in items:
            n += 1
            store = make_store()
            scope = Scope(user_id=f"ou_dec{n}", chat_id=f"oc_dec{n}", chat_type="p2p")
            a = await store.add(scope, first, c1, source="agent_proactive")
            b = await store.add(scope, second, c2, source="agent_proactive")
            active = await store.list(scope.user_id)
            ids = {f.id for f in active}
            if kind == "merge":
                if len(active) != 1:
                    out["duplicates"] += 1
                    out["failures"].append((kind, first, second, b.action))
            elif kind == "changed":
                out["changed"] += 1
                old = await store.get(scope.user_id, a.fact.id)
                kept_both = a.fact.id in ids and b.fact.id in ids and a.fact.id != b.fact.id
                updated = (a.fact.id not in ids and b.fact.id in ids and old is not None
                           and old.superseded_by == b.fact.id)
                if not (kept_both or updated):
                    out["changed_merged"] += 1
                    out["failures"].append((kind, first, second, b.action))
            elif kind == "keep":
                if not (a.fact.id in ids and b.fact.id in ids):
                    out["look_alikes_lost"] += 1
                    out["failures"].append((kind, first, second, b.action))
            else:
                out["corrections"] += 1
                old = await store.get(scope.user_id, a.fact.id)
                if (a.fact.id not in ids and b.fact.id in ids and old is not None
                        and old.superseded_by == b.fact.id and old.superseded_at):
                    out["corrected"] += 1
                else:
                    out["failures"].append((kind, first, second, b.action))
    return out
