"""Who may import whom (DESIGN.md §2, issues 18 and 28): read from the source, so a new import
that breaks a seam fails here rather than in review.

- The handler, the commands, the neutral message and the reply interface know no transport:
  nothing from ``bot/lark/`` or the composition root ``bot/app.py``.
- The interfaces that are peers of Lark (console playground, terminal chat, ``/chat``) do not
  reach into Lark's package either.
- memory/ and the storage engine never import bot/, lark-oapi or aiohttp.
- SQL only in store modules over the port: the engine (storage/), memory/'s stores and the
  declared bot/ stores, each importing the port (``storage``).
- The drivers (aiosqlite, psycopg, psycopg_pool) only in the engine package.
- Nothing imports bot/app.py (the composition root) but the entry points.
- No module cycle in the import graph of bot/, memory/ and storage/ (lazy imports included).
- A capability's storage only through the port: outside storage/, only the composition root,
  the CLI and the settings name an engine module (storage.sqlite, storage.postgres, schema).
- The tree stays readable (issue 46): no folder holds more than 12 modules side by side, no
  product module is over 600 lines, no function in bot/app.py is over 80 lines, and there is
  one ``estimate_tokens``.

Each rule is seen failing on a small tree that breaks it (``test_each_rule_sees_its_break``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TRANSPORT_NEUTRAL = ["bot/core/handler.py", "bot/core/lifecycle.py",
                     *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "bot" / "commands").glob("*.py")),
                     "bot/core/inbound.py", "bot/core/reply.py", "bot/delivery/direct.py",
                     "bot/core/text.py", "bot/infra/terminal.py", "bot/web/playground.py", "bot/web/chat.py",
                     "bot/web/api.py", "bot/web/data.py"]


def imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("rel", TRANSPORT_NEUTRAL)
def test_transport_neutral_modules_do_not_import_lark_or_the_app(rel):
    bad = {m for m in imports(ROOT / rel) if m == "bot.lark" or m.startswith("bot.lark.") or m == "lark_oapi"
           or m.startswith("lark_oapi.")}
    if rel != "bot/infra/terminal.py":          # the terminal starts the app; nothing else may
        bad |= {m for m in imports(ROOT / rel) if m == "bot.app"}
    assert not bad, f"{rel} imports {sorted(bad)}"



# -- the storage port, the engine, the composition root, no cycles (issue 28) --------------------

PRODUCT = ("bot", "memory", "storage")
ENGINE = "storage"                    # the storage engine package: the drivers live here only
DRIVERS = {"aiosqlite", "psycopg", "psycopg_pool", "asyncpg"}
# Store modules outside memory/: the delivery spine's own stores (tests/test_storage_contract.py).
BOT_STORES = ("bot/delivery/*_store.py",)
ENTRY_POINTS = {"bot/infra/cli/serve.py", "bot/infra/terminal.py"}     # `ethan serve`, `ethan chat`: they start the app
# Who may name an engine module rather than the port: they choose and open the engine.
ENGINE_CHOOSERS = ("bot/app.py", "bot/infra/cli*", "bot/infra/config*")
MAX_MODULES = 12          # modules side by side in one folder (__init__ and __main__ not counted)
MAX_LINES = 600           # lines in one product module
MAX_APP_FUNCTION = 80     # lines in one function of the composition root


def product_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for pkg in PRODUCT for p in (root / pkg).rglob("*.py"))


def _rel(p: Path, root: Path = ROOT) -> str:
    return p.relative_to(root).as_posix()


def sql_misplaced(root: Path = ROOT) -> dict[str, list[str]]:
    """Modules holding SQL (or database calls) that are not store modules over the port: SQL is
    the engine's (storage/) or a store's — a memory/ module or a declared bot/ store — and a
    store reaches the database through the port (it imports ``storage``)."""
    from tests.test_storage_contract import findings

    stores = {p for pattern in BOT_STORES for p in root.glob(pattern)}
    out = {}
    for p in product_files(root):
        rel = _rel(p, root)
        if rel.startswith(ENGINE + "/"):
            continue
        found = findings(p)
        if not found:
            continue
        over_port = any(m == ENGINE or m.startswith(ENGINE + ".") for m in imports(p))
        if not ((rel.startswith("memory/") or p in stores) and over_port):
            out[rel] = found[:3] + ([] if over_port else ["does not import the port (storage)"])
    return out


def drivers_outside_the_engine(root: Path = ROOT) -> dict[str, list[str]]:
    """Driver imports (and ``sqlite3.connect``) outside the engine package. sqlite3 itself may be
    imported elsewhere for its exception classes and the connection type of a unit of work."""
    out = {}
    for p in product_files(root):
        rel = _rel(p, root)
        if rel.startswith(ENGINE + "/"):
            continue
        bad = sorted(m for m in imports(p) if m.split(".")[0] in DRIVERS)
        bad += [f"line {n.lineno}: sqlite3.connect" for n in ast.walk(ast.parse(p.read_text()))
                if isinstance(n, ast.Call) and ast.unparse(n.func) == "sqlite3.connect"]
        if bad:
            out[rel] = bad
    return out


def app_importers(root: Path = ROOT) -> set[str]:
    return {_rel(p, root) for p in product_files(root)
            if _rel(p, root) != "bot/app.py" and "bot.app" in imports(p)}


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """The import graph of bot/, memory/ and the engine: every import, at any depth (a lazy import
    inside a function is an edge too: it only hides a cycle from the interpreter)."""
    mods: dict[str, Path] = {}
    for p in product_files(root):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    graph: dict[str, set[str]] = {}
    for name, p in mods.items():
        edges = set()
        package = name.split(".") if p.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                for a in node.names:
                    target = f"{base}.{a.name}"
                    if target in mods:
                        edges.add(target)
                    elif base in mods:
                        edges.add(base)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


@pytest.mark.parametrize("pkg", ["memory", ENGINE])
def test_memory_and_the_engine_never_import_the_bot(pkg):
    found = {_rel(p): sorted(bad) for p in sorted((ROOT / pkg).rglob("*.py"))
             if (bad := {m for m in imports(p) if m.split(".")[0] in ("bot", "lark_oapi", "aiohttp")})}
    assert not found, f"{pkg}/ imports the bot or a transport: {found}"


def test_sql_only_in_store_modules_over_the_port():
    found = sql_misplaced()
    assert not found, f"SQL belongs in a store module over the port (memory/, {BOT_STORES}): {found}"


def test_drivers_only_in_the_engine():
    found = drivers_outside_the_engine()
    assert not found, f"database drivers belong to the engine package ({ENGINE}/): {found}"


def test_nothing_imports_the_app_but_the_entry_points():
    assert app_importers() <= ENTRY_POINTS, f"bot/app.py is the composition root: {app_importers() - ENTRY_POINTS}"


def test_no_module_cycle():
    graph = module_graph()
    assert len(graph) > 100 and "storage.port" in graph and "bot.lark.events" in graph["bot.lark.intake"]
    assert not cycles(graph), f"import cycles: {cycles(graph)}"


def test_each_rule_sees_its_break(tmp_path):
    """Each rule on a small tree that breaks it once (the cycles are the two main had before
    issue 28: memory/db.py ↔ memory/pg.py, bot/lark/events.py ↔ normalize.py through a lazy import)."""
    files = {
        "bot/__init__.py": "",
        "bot/core/handler.py": "async def f(db):\n    return await db.fetchall('SELECT id FROM inbox')\n",
        "bot/web.py": "import psycopg\n",
        "bot/status.py": "def g():\n    from bot.app import EthanApp\n    return EthanApp\n",
        "bot/app.py": "",
        "bot/infra/cli/serve.py": "from bot.app import EthanApp\n",
        "bot/lark/__init__.py": "",
        "bot/lark/events.py": "def ms(v):\n    from bot.lark.normalize import epoch_seconds\n    return epoch_seconds(v)\n",
        "bot/lark/normalize.py": "from bot.lark.events import ms\n",
        "memory/__init__.py": "",
        "memory/own.py": "import sqlite3\nconn = sqlite3.connect('x.db')\nQ = 'SELECT 1 FROM t'\n",
        "memory/facts/store.py": "from storage import Database\nQ = 'SELECT id FROM facts'\n",
        "storage/__init__.py": "from storage.port import Database\n",
        "storage/port.py": "import aiosqlite\nQ = 'SELECT 1 FROM t'\nclass Database: ...\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert set(sql_misplaced(tmp_path)) == {"bot/core/handler.py", "bot/web.py", "memory/own.py"}   # a driver too
    assert drivers_outside_the_engine(tmp_path) == {"bot/web.py": ["psycopg"],
                                                    "memory/own.py": ["line 2: sqlite3.connect"]}
    assert app_importers(tmp_path) - ENTRY_POINTS == {"bot/status.py"}
    assert cycles(module_graph(tmp_path)) == [["bot.lark.events", "bot.lark.normalize"]]


def engine_users(root: Path = ROOT) -> dict[str, list[str]]:
    """Modules outside storage/ that name an engine module (not the port) and may not."""
    from fnmatch import fnmatch

    out = {}
    for p in product_files(root):
        rel = _rel(p, root)
        if rel.startswith(ENGINE + "/") or any(fnmatch(rel, pat) for pat in ENGINE_CHOOSERS):
            continue
        bad = sorted(m for m in imports(p) if m.startswith(ENGINE + ".") and m != ENGINE + ".port")
        if bad:
            out[rel] = bad
    return out


def crowded_folders(root: Path = ROOT) -> dict[str, int]:
    folders: dict[str, int] = {}
    for p in product_files(root):
        if p.name not in ("__init__.py", "__main__.py"):
            folders[_rel(p.parent, root)] = folders.get(_rel(p.parent, root), 0) + 1
    return {f: n for f, n in folders.items() if n > MAX_MODULES}


def long_modules(root: Path = ROOT) -> dict[str, int]:
    return {_rel(p, root): n for p in product_files(root) if (n := len(p.read_text().splitlines())) > MAX_LINES}


def long_functions(path: Path) -> dict[str, int]:
    out = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_APP_FUNCTION:
                out[node.name] = n
    return out


def definitions_of(name: str, root: Path = ROOT) -> list[str]:
    return [_rel(p, root) for p in product_files(root)
            if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
                   for n in ast.walk(ast.parse(p.read_text(), str(p))))]


def test_engines_only_through_the_port():
    found = engine_users()
    assert not found, f"outside storage/, use the port (storage); engines are chosen by {ENGINE_CHOOSERS}: {found}"


def test_no_crowded_folder():
    assert not crowded_folders(), f"more than {MAX_MODULES} modules side by side: {crowded_folders()}"


def test_no_long_module():
    assert not long_modules(), f"product modules over {MAX_LINES} lines: {long_modules()}"


def test_the_composition_root_reads_as_steps():
    found = long_functions(ROOT / "bot" / "app.py")
    assert not found, f"functions of bot/app.py over {MAX_APP_FUNCTION} lines: {found}"


def test_one_token_estimate():
    assert len(definitions_of("estimate_tokens")) == 1, definitions_of("estimate_tokens")


def test_each_tree_rule_sees_its_break(tmp_path):
    """The issue-46 rules on a small tree that breaks each once."""
    files = {
        "bot/__init__.py": "",
        "bot/app.py": "def start():\n" + "    x = 1\n" * MAX_APP_FUNCTION + "\n\ndef ok():\n    pass\n",
        "bot/crowd/__init__.py": "",
        **{f"bot/crowd/m{i}.py": "" for i in range(MAX_MODULES + 1)},
        "bot/core/handler.py": "from storage.sqlite import SqliteDatabase\nfrom storage.port import Database\n",
        "bot/infra/config.py": "from storage.postgres import url_problem\n",
        "memory/__init__.py": "",
        "memory/big.py": "x = 1\n" * (MAX_LINES + 1),
        "memory/a.py": "def estimate_tokens(t):\n    return len(t)\n",
        "memory/b.py": "def estimate_tokens(t):\n    return len(t) // 4\n",
        "storage/__init__.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert engine_users(tmp_path) == {"bot/core/handler.py": ["storage.sqlite"]}
    assert crowded_folders(tmp_path) == {"bot/crowd": MAX_MODULES + 1}
    assert long_modules(tmp_path) == {"memory/big.py": MAX_LINES + 1}
    assert long_functions(tmp_path / "bot" / "app.py") == {"start": MAX_APP_FUNCTION + 1}
    assert definitions_of("estimate_tokens", tmp_path) == ["memory/a.py", "memory/b.py"]
