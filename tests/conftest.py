"""Shared fixtures. Fakes live in tests/fakes (wire-level servers on loopback)."""

from __future__ import annotations

import pytest

from memory.db import Database


@pytest.fixture
async def db(tmp_path):
    database = await Database(tmp_path / "ethan.db").open()
    try:
        yield database
    finally:
        await database.close()
