"""Long connection: the SDK acknowledges a frame only after our handler returns, so the
handler must have committed the event to the inbox by then (acknowledged means stored)."""

from __future__ import annotations

import asyncio
import json

import pytest

from bot.lark.ws import StoringEventHandler
from tests.fakes.fake_anthropic import Text
from tests.fakes.lark_events import make_text_event
from tests.harness import Harness


async def test_event_is_stored_before_the_frame_is_acknowledged(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(Text("via the long connection"))
        handler = StoringEventHandler(h.app.intake, asyncio.get_running_loop())
        event = make_text_event("hello over ws", chat_id="oc_p2p_alice")
        payload = json.dumps(event).encode()

        def sdk_thread():
            # What lark_oapi.ws.Client does on its own loop/thread for an EVENT frame.
            handler._do_without_validation(payload)
            return True

        done = await asyncio.to_thread(sdk_thread)
        assert done
        row = await h.app.db.fetchone("SELECT event_id, status FROM inbox WHERE event_id = ?",
                                      (event["header"]["event_id"],))
        assert row is not None                     # stored by the time the SDK acknowledges
        [reply] = await h.replies(1)
        assert reply.text == "via the long connection"
        # Redelivery over the long connection is deduplicated like webhook retries.
        await asyncio.to_thread(sdk_thread)
        await h.idle()
        assert len(h.lark.messages()) == 1


async def test_store_failure_makes_the_sdk_answer_an_error(tmp_path):
    async with Harness(tmp_path) as h:
        handler = StoringEventHandler(h.app.intake, asyncio.get_running_loop())
        await h.app.db.close()   # the database is gone: nothing can be stored
        payload = json.dumps(make_text_event("lost?", chat_id="oc_p2p_alice")).encode()
        with pytest.raises(Exception):
            await asyncio.to_thread(handler._do_without_validation, payload)
        await h.app.db.open()
