"""MCP servers as providers of the tool port, with the official ``mcp`` SDK.

Each server in config.yaml's ``mcp_servers:`` is one ``McpServer`` (provider name
``mcp_<server>``, tools ``mcp_<server>__<tool>``). A supervisor task per server connects
(stdio: the command under ``bot/tools/mcp_child.py``, so it dies with Ethan; or streamable
HTTP: url + headers), lists the tools, refreshes them on ``notifications/tools/list_changed``,
pings it while idle, and when it dies (a failed call, a failed ping, the pipe closing)
reconnects with backoff. A server that cannot start is one log line naming it and its
problem in ``/healthz``; Ethan answers without its tools meanwhile.

A tool is read-only only when the operator's config says so (``read_only: true`` for the whole
server, ``read_only_tools: [...]``); everything else is side-effecting (policy: p2p only by
default; in a group after the asker's click). A server's ``readOnlyHint`` is not trusted: the MCP
spec calls annotations untrusted hints, and a server that says "read-only" about a tool that
writes would otherwise run it in a group without the confirm card (issue 45, N4).

A server's tool list goes with every request in every chat, so it is bounded (issue 45, N5): per
server (``max_tools``, ``max_tool_bytes`` of name + description + schema) and for all servers
together (``tools.mcp_max_tools``, ``tools.mcp_max_bytes``). A list over either is refused as a
whole — none of that server's tools are offered — with one ``mcp.tools_refused`` line naming the
server and the sizes, also when a ``list_changed`` refresh grows it.

A stdio server's stderr is never copied into Ethan's log as it is (a server could print a line
that reads as one of Ethan's own events, issue 45, N10): it arrives through a pipe, and each line
becomes an ``mcp.stderr`` record with the server's name and the line as a field, cut at
``STDERR_LINE_CHARS`` and at most ``STDERR_LINES`` per ``STDERR_WINDOW_S`` (the rest counted in
``mcp.stderr_dropped``). The SDK's own stdlib-logging records become ``mcp.sdk`` records.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Sequence

from bot.infra.log import get_logger
from bot.tools.base import ToolContext, ToolError
from bot.tools.registry import ToolDef

log = get_logger("ethan.mcp")

KEEPER = Path(__file__).with_name("mcp_child.py")
BACKOFF_S = (0.5, 1, 2, 5, 10, 30)
STARTUP_S = 15.0      # initialize + first tools/list (a cold npx download is slow); calls use the timeout
STDERR_LINE_CHARS = 1000   # one stderr line in the log; longer ones are cut (``cut: true``)
STDERR_LINES = 50          # stderr lines logged per server per window; the rest are counted
STDERR_WINDOW_S = 10.0
REFRESH_MIN_S = 1.0   # list_changed re-reads a list at most this often (a server may send it in a loop)
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


@dataclass
class ToolBudget:
    """The limit on all servers' tools together, and what each admitted server uses of it.

    Shared by the servers of one app; checked and updated with no await in between (one loop)."""

    max_tools: int = 128
    max_bytes: int = 262_144
    used: dict[str, tuple[int, int]] = field(default_factory=dict)   # server -> (tools, bytes)

    def others(self, server: str) -> tuple[int, int]:
        rest = [v for k, v in self.used.items() if k != server]
        return sum(n for n, _ in rest), sum(b for _, b in rest)


def definition_bytes(name: str, description: str, schema: Any) -> int:
    """What one tool adds to every request: its name, description and schema as JSON."""
    return len(json.dumps({"name": name, "description": description, "input_schema": schema},
                          ensure_ascii=False, separators=(",", ":")).encode())


class McpServer:
    """One configured MCP server: a tool provider with a supervisor task."""

    def __init__(self, server: str, config: Any, *, ping_seconds: float = 15.0,
                 budget: ToolBudget | None = None) -> None:
        self.server = server
        self.budget = budget if budget is not None else ToolBudget()
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
        self._refused: tuple | None = None     # the last refusal logged (one line per new one)
        self._hinted = 0                       # tools the server calls read-only and the config does not
        self._stderr = _StderrBudget()          # across restarts: a crash loop does not reset it
        self._pumps: set[asyncio.BaseTransport] = set()
        self._listed_at = 0.0

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
        for pump in list(self._pumps):
            pump.close()

    def _transport(self, errlog: Any = None):
        c = self.config
        if c.url:
            return _http_transport(c.url, {k: expand(v) for k, v in c.headers.items()}, c.timeout)
        from mcp import StdioServerParameters
        from mcp.client.stdio import get_default_environment, stdio_client
        env = {**get_default_environment(), **{k: expand(v) for k, v in c.env.items()},
               "ETHAN_MCP_PARENT": str(os.getpid())}
        params = StdioServerParameters(command=sys.executable, args=[str(KEEPER), c.command, *c.args],
                                       env=env, cwd=c.cwd or None)
        return stdio_client(params, errlog=errlog)

    async def _stderr_pipe(self):
        """A pipe for the child's stderr; its lines become ``mcp.stderr`` records (N10)."""
        r, w = os.pipe()
        reader = os.fdopen(r, "rb", buffering=0)
        try:
            transport, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: _StderrLines(self.server, self._stderr, self._pumps), reader)
        except BaseException:
            reader.close()
            os.close(w)
            raise
        self._pumps.add(transport)
        return os.fdopen(w, "w")

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
                self.budget.used.pop(self.server, None)
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
        self._dead.clear()
        errlog = None if self.config.url else await self._stderr_pipe()
        try:
            async with self._transport(errlog) as streams:
                if errlog is not None:
                    errlog.close()    # the child has its copy: the pipe ends when the child's does
                await self._session_on(streams[0], streams[1])
        finally:
            if errlog is not None:
                errlog.close()

    async def _session_on(self, read: Any, write: Any) -> None:
        from mcp import ClientSession

        async with ClientSession(read, write, message_handler=self._on_message,
                                 read_timeout_seconds=timedelta(seconds=self.config.timeout * 4)) as session:
            await asyncio.wait_for(session.initialize(), max(STARTUP_S, self.config.timeout))
            await self._list(session, max(STARTUP_S, self.config.timeout))
            self._session = session
            if self._refused is None:     # a refused list stays the problem /healthz shows
                self.problem = ""
            self._connected.set()
            log.info("mcp.server_ready", server=self.server, tools=len(self._defs), restarts=self.restarts,
                     read_only=sum(d.read_only for d in self._defs), hinted_read_only=self._hinted)
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
                # a server sending list_changed in a loop gets its list read once a second at most
                await asyncio.sleep(max(0.0, self._listed_at + REFRESH_MIN_S - time.monotonic()))
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
        self._listed_at = time.monotonic()
        c = self.config
        tools = listed.tools
        size = 0
        defs = []
        hinted = 0
        if len(tools) > c.max_tools:
            return self._refuse("server", len(tools), self._bytes(tools), c.max_tools, c.max_tool_bytes)
        for t in tools:
            # Only the operator's config makes a tool read-only; the server's readOnlyHint is an
            # untrusted hint and never relaxes the group policy or the confirm card (N4).
            read_only = bool(c.read_only) if c.read_only is not None else t.name in c.read_only_tools
            ann = getattr(t, "annotations", None)
            hinted += bool(ann and ann.readOnlyHint and not read_only)
            name, description, schema = self._definition(t)
            size += definition_bytes(name, description, schema)
            defs.append(ToolDef(name, description, schema, self._caller(t.name),
                                read_only=read_only, timeout=c.timeout))
        if size > c.max_tool_bytes:
            return self._refuse("server", len(tools), size, c.max_tools, c.max_tool_bytes)
        n_others, b_others = self.budget.others(self.server)
        if n_others + len(defs) > self.budget.max_tools or b_others + size > self.budget.max_bytes:
            return self._refuse("total", len(defs), size, self.budget.max_tools - n_others,
                                self.budget.max_bytes - b_others)
        self.budget.used[self.server] = (len(defs), size)
        self._defs = tuple(defs)
        self._hinted = hinted
        self._refused = None
        if self.problem and self.problem.startswith("tools refused"):
            self.problem = ""

    def _definition(self, t: Any) -> tuple[str, str, dict[str, Any]]:
        """A listed tool as the model is shown it: name, description, schema."""
        return (tool_name(self.server, t.name), (t.description or t.title or t.name)[:1024],
                dict(t.inputSchema or {"type": "object", "properties": {}}))

    def _bytes(self, tools: Sequence[Any]) -> int:
        return sum(definition_bytes(*self._definition(t)) for t in tools)

    def _refuse(self, limit: str, tools: int, size: int, max_tools: int, max_bytes: int) -> None:
        """None of this server's tools are offered; one log line per new refusal (N5)."""
        self._defs = ()
        self.budget.used.pop(self.server, None)
        self.problem = (f"tools refused: {tools} tools, {size} bytes of definitions; "
                        + (f"this server's limit is {max_tools} tools, {max_bytes} bytes" if limit == "server"
                           else f"all servers' limit leaves {max_tools} tools, {max_bytes} bytes"))
        key = (limit, tools, size)
        if key != self._refused:
            self._refused = key
            log.warning("mcp.tools_refused", server=self.server, limit=limit, tools=tools, bytes=size,
                        max_tools=max_tools, max_bytes=max_bytes)

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


class _StderrBudget:
    """How many stderr lines one server may put in the log per window (N10: a server cannot
    flood the log, nor the loop with log writes)."""

    def __init__(self) -> None:
        self.window = -STDERR_WINDOW_S
        self.logged = 0
        self.dropped = 0

    def take(self, server: str) -> bool:
        now = time.monotonic()
        if now - self.window >= STDERR_WINDOW_S:
            self.flush(server)
            self.window, self.logged = now, 0
        if self.logged >= STDERR_LINES:
            self.dropped += 1
            return False
        self.logged += 1
        return True

    def flush(self, server: str) -> None:
        if self.dropped:
            log.warning("mcp.stderr_dropped", server=server, lines=self.dropped,
                        limit=STDERR_LINES, window_s=STDERR_WINDOW_S)
            self.dropped = 0


class _StderrLines(asyncio.Protocol):
    """A stdio server's stderr pipe: each line one ``mcp.stderr`` record, never a raw line."""

    def __init__(self, server: str, budget: _StderrBudget, pumps: set) -> None:
        self.server = server
        self.budget = budget
        self.pumps = pumps
        self.transport: asyncio.BaseTransport | None = None
        self.partial = b""
        self.skipping = False     # inside a line already logged cut: drop it up to its newline

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            if self.skipping:
                self.skipping = False
            else:
                self._line(line)
        if len(self.partial) > STDERR_LINE_CHARS * 4:      # no newline yet: bounded memory
            if not self.skipping:
                self._line(self.partial, cut=True)
            self.partial, self.skipping = b"", True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.partial and not self.skipping:
            self._line(self.partial)
        self.partial = b""
        self.budget.flush(self.server)
        self.pumps.discard(self.transport)

    def _line(self, raw: bytes, cut: bool = False) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if not text.strip() or not self.budget.take(self.server):
            return
        cut = cut or len(text) > STDERR_LINE_CHARS
        log.info("mcp.stderr", server=self.server, line=text[:STDERR_LINE_CHARS], **({"cut": True} if cut else {}))


class _SdkRecords(logging.Handler):
    """The ``mcp`` SDK's stdlib-logging records as ``mcp.sdk`` JSON records, not raw text lines
    (e.g. "Failed to parse JSONRPC message from server" with its traceback)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, Any] = {"module": record.name,
                                      "message": " ".join(record.getMessage().split())[:STDERR_LINE_CHARS]}
            if record.exc_info and record.exc_info[1] is not None:
                fields["error"] = _why(record.exc_info[1])
            level = ("error" if record.levelno >= logging.ERROR else
                     "warning" if record.levelno >= logging.WARNING else "info")
            getattr(log, level)("mcp.sdk", **fields)
        except Exception:  # noqa: BLE001 — logging must never raise into the SDK
            self.handleError(record)


def route_sdk_logging() -> None:
    """Once per process: the SDK's records go through Ethan's structured log only."""
    sdk = logging.getLogger("mcp")
    if not any(isinstance(h, _SdkRecords) for h in sdk.handlers):
        sdk.addHandler(_SdkRecords())
        sdk.propagate = False


class McpServers:
    """Every configured server: started with the app, stopped with it."""

    def __init__(self, configs: dict[str, Any], *, ping_seconds: float = 15.0,
                 budget: ToolBudget | None = None) -> None:
        self.budget = budget if budget is not None else ToolBudget()
        route_sdk_logging()
        self.servers = [McpServer(n, c, ping_seconds=ping_seconds, budget=self.budget)
                        for n, c in configs.items()]

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
