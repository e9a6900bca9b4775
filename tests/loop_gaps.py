"""How long the event loop was held while a call ran: a ticker wakes every 10 ms and records
the gap since its last wake; a call that blocks the loop shows as one long gap."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator


@asynccontextmanager
async def loop_gaps() -> AsyncIterator[list[float]]:
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    t = asyncio.get_running_loop().create_task(ticker())
    await asyncio.sleep(0.05)             # the ticker is running before the call
    try:
        yield gaps
        await asyncio.sleep(0.05)         # the ticker's turn after the call: a held loop shows as a gap
    finally:
        t.cancel()
