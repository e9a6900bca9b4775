"""Versioned schema. ``MIGRATIONS[i]`` upgrades a database from version i to i+1.

Version 1 is the concatenation of each layer's DDL (one module per layer, so a
layer's tables live beside nothing else's). Later versions are appended as
ALTER/CREATE scripts and never edited once released.
"""

from storage.schema import core, sessions, working, facts, procedures, profile, episodic, schedules

V1 = "\n".join(m.V1 for m in (core, sessions, working, facts, procedures, profile, episodic))

MIGRATIONS: list[str] = [
    V1,
    sessions.V2,   # index for resolving short session ids by their tail
    core.V3,       # outbox.card_id: the card a crashed reply was streaming into
    episodic.V4 + facts.V4,  # episodes index their turns (episode_chunks + FTS), dates; fact_sources
    core.V5,       # inbox dedup keyed on the event (dedup_key), chat_greetings
    core.V6,       # chats_left: chats the bot was removed from survive a restart
    core.V7,       # replicas: inbox row owner + lease, conversation leases, consolidation claims
    profile.V8,    # profile_sources: which sessions taught each profile entry
    episodic.V9,   # PostgreSQL's BM25 statistics (term_array, episode_index_stats); a no-op on SQLite
    schedules.V10, # reminders: schedules + schedule_deliveries
    episodic.V11,  # episode_vectors: semantic recall (issue 31)
    facts.V12,     # fact_messages: every message a fact was learned from (issue 32)
]
