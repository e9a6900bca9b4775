"""MCP servers as providers of the tool port, with the official ``mcp`` SDK.

Each server in config.yaml's ``mcp_servers:`` is one ``McpServer`` (provider name
``mcp_<server>``, tools ``mcp_<server>__<tool>``). A supervisor task per server connects
(stdio: the command under ``bot/tools/mcp_child.py``, so it dies with Ethan; or streamable
HTTP: url + headers), lists the tools, refreshes them on ``notifications/tools/list_changed``,
pings it while idle, and when it dies (a failed call, a failed ping, the pipe closing)
reconnects with backoff. A server that cannot start is one log line naming it and its
problem in ``/healthz``; Ethan answers without its tools meanwhile.

A tool is read-only when the server annotates it ``readOnlyHint: true`` or the config says so
(``read_only: true`` for the whole server, ``read_only_tools: [...]``); everything else is
side-effecting (policy: p2p only by default; in a group after the asker's click).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Sequence

from bot.log import get_logger
from bot.tools.base import ToolContext, ToolError
from bot.tools.registry import ToolDef

log = get_logger("ethan.mcp")

KEEPER = Path(__file__).with_name("mcp_child.py")
BACKOFF_S = (0.5, 1, 2, 5, 10, 30)
STARTUP_S = 15.0      # initialize + first tools/list (a cold npx download is slow); calls use the timeout
_SAFE = re.compile(r"[^a-zA-Z0-9_-]")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(value: str) -> str:
    """``${VAR}`` from the environment: keys stay out of config.yaml."""
    return _VAR.sub(lambda m: os.environ.get(m.group(1), ""), value)


def tool_name(server: str, tool: str) -> str:
    """``mcp_<server>__<tool>`` within the providers' limit (64, [a-zA-Z0-9_-])."""
    name = f"mcp_{server}__{_SAFE.sub('_', tool)}"
    if len(name) <= 64:
        return name
    digest = hashlib.sha1(tool.encode()).hexdigest()[:8]
    return name[:55] + "_" + digest


def result_text(result: Any) -> str:
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            res = block.resource
            parts.append(getattr(res, "text", None) or f"[resource {getattr(res, 'uri', '')}]")
        elif kind == "resource_link":
            parts.append(f"[link {getattr(block, 'uri', '')}]")
        else:
            parts.append(f"[{kind or 'content'} omitted]")
    if not parts and getattr(result, "structuredContent", None) is not None:
        parts.append(json.dumps(result.structuredContent, ensure_ascii=False))
    return "\n".join(parts)


class McpServer:
    """One configured MCP server: a tool provider with a supervisor task."""

    def __init__(self, server: str, config: Any, *, ping_seconds: float = 15.0) -> None:
        self.server = server
        self.name = f"mcp_{server}"
        self.config = config
        self.ping_seconds = ping_seconds
        self.problem: str | None = None       # None: not connected yet; "": fine; else why not
        self.restarts = 0
        self._defs: tuple[ToolDef, ...] = ()
        self._session: Any = None
        self._task: asyncio.Task | None = None
        self._dead = asyncio.Event()
        self._refresh = asyncio.Event()
        self._connected = asyncio.Event()
        self._stopping = False

    # -- provider ---------------------------------------------------------------------
    def tools(self) -> Sequence[ToolDef]:
        return self._defs if self._session is not None else ()

    def status(self) -> dict[str, Any]:
        return {"ok": self.problem == "", "tools": len(self._defs), "restarts": self.restarts,
                **({"problem": self.problem} if self.problem else {}),
                "transport": "http" if self.config.url else "stdio"}

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"mcp:{self.server}")

    async def wait_connected(self, timeout: float) -> bool:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._connected.wait(), timeout)
        return self._connected.is_set()

    async def stop(self) -> None:
        self._stopping = True
        self._dead.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 5.0)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task

    def _transport(self):
        c = self.config
        if c.url:
            return _http_transport(c.url, {k: expand(v) for k, v in c.headers.items()}, c.timeout)
        from mcp import StdioServerParameters
        from mcp.client.stdio import get_default_environment, stdio_client
        env = {**get_default_environment(), **{k: expand(v) for k, v in c.env.items()},
               "ETHAN_MCP_PARENT": str(os.getpid())}
        params = StdioServerParameters(command=sys.executable, args=[str(KEEPER), c.command, *c.args],
                                       env=env, cwd=c.cwd or None)
        return stdio_client(params, errlog=_errlog())

    async def _supervise(self) -> None:
        attempt = 0
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._connect_once()
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # noqa: BLE001 — anyio groups; a server's failure is its own
                if self._stopping:
                    break
                why = _why(e)
                if why != self.problem:    # one line per new problem, not one per retry
                    log.warning("mcp.server_failed", server=self.server, error=why, attempt=attempt + 1)
                self.problem = why
            finally:
                self._session = None
                self._connected.clear()
            if self._stopping:
                break
            if time.monotonic() - started > 60:
                attempt = 0
            delay = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
            attempt += 1
            self.restarts += 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wait_stop(), delay)

    async def _wait_stop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(0.05)

    async def _connect_once(self) -> None:
        from mcp import ClientSession

        self._dead.clear()
        async with self._transport() as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write, message_handler=self._on_message,
                                     read_timeout_seconds=timedelta(seconds=self.config.timeout * 4)) as session:
                await asyncio.wait_for(session.initialize(), max(STARTUP_S, self.config.timeout))
                await self._list(session, max(STARTUP_S, self.config.timeout))
                self._session = session
                self.problem = ""
                self._connected.set()
                log.info("mcp.server_ready", server=self.server, tools=len(self._defs), restarts=self.restarts)
                await self._watch(session)
                if not self._stopping:
                    raise ConnectionError("the server stopped answering")

    async def _watch(self, session: Any) -> None:
        while not self._dead.is_set():
            waits = [asyncio.ensure_future(self._dead.wait()), asyncio.ensure_future(self._refresh.wait())]
            done, pending = await asyncio.wait(waits, timeout=self.ping_seconds,
                                               return_when=asyncio.FIRST_COMPLETED)
            for w in pending:
                w.cancel()
            if self._dead.is_set():
                return
            if self._refresh.is_set():
                self._refresh.clear()
                await self._list(session)
                log.info("mcp.tools_changed", server=self.server, tools=len(self._defs))
                continue
            try:
                await asyncio.wait_for(session.send_ping(), min(10.0, self.config.timeout))
            except Exception as e:  # noqa: BLE001
                raise ConnectionError(f"ping failed ({_why(e)})") from None

    async def _on_message(self, message: Any) -> None:
        from mcp import types
        root = getattr(message, "root", None)
        if isinstance(root, types.ToolListChangedNotification):
            self._refresh.set()

    async def _list(self, session: Any, timeout: float | None = None) -> None:
        listed = await asyncio.wait_for(session.list_tools(), timeout or self.config.timeout)
        c = self.config
        defs = []
        for t in listed.tools:
            ann = getattr(t, "annotations", None)
            if c.read_only is not None:
                read_only = bool(c.read_only)
            else:
                read_only = t.name in c.read_only_tools or bool(ann and ann.readOnlyHint)
            schema = dict(t.inputSchema or {"type": "object", "properties": {}})
            defs.append(ToolDef(tool_name(self.server, t.name),
                                (t.description or t.title or t.name)[:1024], schema,
                                self._caller(t.name), read_only=read_only, timeout=c.timeout))
        self._defs = tuple(defs)

    def _caller(self, remote: str):
        async def call(ctx: ToolContext, args: dict[str, Any]) -> str:
            session = self._session
            if session is None:
                raise ToolError(f"the {self.server} server is not connected right now")
            try:
                result = await session.call_tool(remote, args)
            except Exception as e:
                if _closed(e):
                    self._dead.set()      # restart it now rather than at the next ping
                    raise ToolError(f"the {self.server} server stopped during the call; it is being "
                                    "restarted — tell the user to try again in a moment") from None
                raise
            text = result_text(result)
            if result.isError:
                raise ToolError(text or "the tool reported an error")
            return text
        return call


@contextlib.asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str], timeout: float):
    import httpx
    from mcp.client.streamable_http import streamable_http_client

    # read: an SSE stream stays open between events; a call's own limit is the tool's timeout
    async with httpx.AsyncClient(headers=headers, follow_redirects=True,
                                 timeout=httpx.Timeout(timeout, read=300.0)) as client:
        async with streamable_http_client(url, http_client=client) as streams:
            yield streams


def _closed(e: BaseException) -> bool:
    from mcp.shared.exceptions import McpError
    from mcp.types import CONNECTION_CLOSED
    if isinstance(e, McpError):
        return e.error.code == CONNECTION_CLOSED
    import anyio
    return isinstance(e, (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError, EOFError))


def _why(e: BaseException) -> str:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{e.__class__.__name__}: {text}"[:200] if text else e.__class__.__name__


def _errlog():
    """A server's stderr: our stderr (systemd's journal), unless that is not a real file."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        return open(os.devnull, "w")  # noqa: SIM115 — lives as long as the process


class McpServers:
    """Every configured server: started with the app, stopped with it."""

    def __init__(self, configs: dict[str, Any], *, ping_seconds: float = 15.0) -> None:
        self.servers = [McpServer(n, c, ping_seconds=ping_seconds) for n, c in configs.items()]

    async def start(self, wait: float = 10.0) -> None:
        for s in self.servers:
            s.start()
        if self.servers:
            await asyncio.gather(*(s.wait_connected(wait) for s in self.servers))
        for s in self.servers:
            if s.problem is None:
                s.problem = f"not connected after {wait:g} s"
                log.warning("mcp.server_failed", server=s.server, error=s.problem, attempt=1)

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers), return_exceptions=True)

    def status(self) -> dict[str, Any]:
        return {s.server: s.status() for s in self.servers}
