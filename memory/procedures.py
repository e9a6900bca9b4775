"""Behaviour rules (procedures): how to answer, injected as ``<behavioral_guidelines>``.

A rule has a scope:

* ``user`` (``scope_id`` = the speaker's open_id) — written by ``procedure_write`` for the
  speaking user, or by the user in the console;
* ``chat`` (``scope_id`` = chat_id) — the whole chat's rules; only an admin may add or delete
  them (``PermissionError`` otherwise).

Both come from the event's ``Scope``, never from the model's arguments.

``for_request(scope)`` returns the chat's rules for ``scope.chat_id`` followed by the user's
own rules (the more specific last). **User rules apply wherever the user speaks**, p2p or
group, whatever chat they were set in: a rule is an instruction about how to answer this
person ("always reply in Chinese", "no emoji", "keep it short"), not a fact about them, and a
user who sets one in a direct message expects it to hold when they @mention the bot in a group
too; it shapes only the replies to that user. Where it was set is still recorded (``chat_id``,
``message_id``, ``visibility`` = where it was learned) for the console and a later policy
change. Rules that carry private information belong in facts or the profile, which keep the
p2p privacy rule.

Rules are de-duplicated per scope: a rule equal after ``similarity.normalise``, or the same
statement by ``memory.facts.matching.relation`` (similarity >= ``SAME`` with the same polarity and no
substituted value — so "回复都用简体中文，不用繁体" and "回复都用繁体中文，不用简体" stay two
rules), returns the existing rule (``created=False``). A new rule does not replace a
contradicting one; both are kept and shown. Rules are one line of at
most ``MAX_RULE_CHARS`` characters, never credentials, and each scope holds at most
``max_rules`` of them (they are injected into every prompt). Errors are ``ValueError`` with a
message meant to be returned to the model as a tool error.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from storage import Database, serialize
from memory.queries import Query, run
from memory.text.redact import looks_like_secret
from memory.scope import Scope
from memory.facts.matching import SAME_FACT, relation
from memory.text.similarity import normalise

MAX_RULE_CHARS = 500
MAX_CONTEXT_CHARS = 500
DEFAULT_MAX_RULES = 50
USER, CHAT = "user", "chat"


@dataclass(frozen=True, slots=True)
class Procedure:
    id: int
    scope: str          # user | chat
    scope_id: str       # open_id or chat_id
    rule: str
    context: str
    visibility: str     # where it was set: private (p2p) or shared; not a filter (module docs)
    created_by: str
    chat_id: str
    message_id: str
    created_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_COLUMNS = "id, scope, scope_id, rule, context, visibility, created_by, chat_id, message_id, created_at"


def _procedure(row: Any) -> Procedure:
    return Procedure(**{k: row[k] for k in _COLUMNS.split(", ")})


def clean_rule(rule: str) -> str:
    if not isinstance(rule, str):
        raise ValueError("rule must be text")
    text = rule.strip()
    if not text or not normalise(text):
        raise ValueError("rule is empty: state the behaviour rule in one sentence")
    if "\n" in text or "\r" in text:
        raise ValueError("rule must be a single line: write one rule per procedure_write call")
    text = " ".join(text.split())
    if len(text) > MAX_RULE_CHARS:
        raise ValueError(
            f"rule is too long ({len(text)} characters, at most {MAX_RULE_CHARS}); shorten it to one sentence"
        )
    if looks_like_secret(text):
        raise ValueError("refused: the rule looks like it contains a password, key or token")
    return text


def clean_context(context: str) -> str:
    text = " ".join((context or "").split())
    if len(text) > MAX_CONTEXT_CHARS:
        raise ValueError(f"context is too long ({len(text)} characters, at most {MAX_CONTEXT_CHARS})")
    if looks_like_secret(text):
        raise ValueError("refused: the context looks like it contains a password, key or token")
    return text


class ProcedureStore:
    def __init__(
        self,
        db: Database,
        *,
        max_rules: int = DEFAULT_MAX_RULES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.max_rules = max_rules
        self.clock = clock

    async def add(
        self, scope: Scope, rule: str, context: str = "", *, chat_scope: bool = False
    ) -> tuple[Procedure, bool]:
        """Add a rule for the speaking user (or, for an admin with ``chat_scope``, the chat)."""
        text = clean_rule(rule)
        ctx = clean_context(context)
        if not scope.user_id:
            raise ValueError("no user to store the rule for")
        if chat_scope:
            if not scope.is_admin:
                raise PermissionError(
                    "only an admin can set rules for the whole chat; "
                    "save it as a rule for this user instead (chat_scope=false)"
                )
            if not scope.chat_id:
                raise ValueError("no chat to store the rule for")
            kind, owner = CHAT, scope.chat_id
        else:
            kind, owner = USER, scope.user_id
        norm = normalise(text)

        now = self.clock()

        # Read, compare and insert as one Database.write in the SQLite thread (one round trip;
        # the procedure_write tool calls this on the reply path).
        def write(tx: Any) -> tuple[Procedure, bool]:
            serialize(tx, "rules", f"{kind}:{owner}")   # the rules are read, compared, then added to
            rows = tx.execute(
                f"SELECT {_COLUMNS}, norm FROM procedures WHERE scope = ? AND scope_id = ? ORDER BY id",
                (kind, owner),
            ).fetchall()
            for row in rows:
                if row["norm"] == norm or relation(text, row["rule"]) == SAME_FACT:
                    return _procedure(row), False
            if len(rows) >= self.max_rules:
                raise ValueError(
                    f"there are already {len(rows)} rules here (at most {self.max_rules}); "
                    "ask the user which one to delete first"
                )
            new_id = int(tx.execute(
                "INSERT INTO procedures(scope, scope_id, rule, context, norm, visibility, created_by, "
                "chat_id, message_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (kind, owner, text, ctx, norm, scope.new_visibility, scope.user_id,
                 scope.chat_id, scope.message_id, now),
            ).lastrowid)
            return _procedure(tx.execute(f"SELECT {_COLUMNS} FROM procedures WHERE id = ?", (new_id,)).fetchone()), True

        return await self.db.write(write)

    async def for_request(self, scope: Scope) -> list[Procedure]:
        """The chat's rules, then the speaking user's (module docs: user rules apply everywhere)."""
        return await run(self.db, self.for_request_query(scope))

    def for_request_query(self, scope: Scope) -> Query[list[Procedure]]:
        return Query(((f"SELECT {_COLUMNS} FROM procedures "
                       "WHERE (scope = 'chat' AND scope_id = ?) OR (scope = 'user' AND scope_id = ?) "
                       "ORDER BY scope = 'user', created_at, id", (scope.chat_id, scope.user_id)),),
                     lambda rows: [_procedure(r) for r in rows[0]])

    async def list(self, user_id: str, chat_id: str | None = None) -> list[Procedure]:
        """The user's rules, plus the rules of ``chat_id`` when given (chat rules first)."""
        if chat_id:
            where, params = "(scope = 'user' AND scope_id = ?) OR (scope = 'chat' AND scope_id = ?)", (user_id, chat_id)
        else:
            where, params = "scope = 'user' AND scope_id = ?", (user_id,)
        rows = await self.db.fetchall(
            f"SELECT {_COLUMNS} FROM procedures WHERE {where} ORDER BY scope = 'user', created_at, id",
            params,
        )
        return [_procedure(r) for r in rows]

    async def delete(self, scope: Scope, proc_id: int) -> bool:
        """Delete one of the speaker's own rules, or (admins only) one of this chat's rules.

        False when no such rule is visible from this scope; PermissionError when it is a rule of
        this chat and the speaker is not an admin.
        """
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "SELECT scope FROM procedures WHERE id = ? AND "
                "((scope = 'user' AND scope_id = ?) OR (scope = 'chat' AND scope_id = ?))",
                (proc_id, scope.user_id, scope.chat_id),
            )
            row = await cur.fetchone()
            await cur.close()
            if row is None:
                return False
            if row["scope"] == CHAT and not scope.is_admin:
                raise PermissionError("only an admin can delete this chat's rules")
            owner = scope.chat_id if row["scope"] == CHAT else scope.user_id
            cur = await tx.execute(
                "DELETE FROM procedures WHERE id = ? AND scope = ? AND scope_id = ?",
                (proc_id, row["scope"], owner),
            )
            n = cur.rowcount
            await cur.close()
        return n > 0

    async def delete_all(self, user_id: str) -> int:
        """All of the user's own rules. Chat rules they set as an admin belong to the chat and stay."""
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "DELETE FROM procedures WHERE scope = 'user' AND scope_id = ?", (user_id,)
            )
            n = cur.rowcount
            await cur.close()
        return n
