"""docs/internals.md says what the code is (issue 28): every signature in its code blocks is read
back against the code with ``inspect.signature`` — the parameter names in order, which are
keyword-only, which have defaults and the defaults' values — and every module path it names in
backticks exists. (The false ones this caught: ``Consolidator(client, *, main_model, …)``,
``EpisodeStore.search``'s default method, ``recall``'s k as the only budget, the port's methods.)

The block's syntax: ``Name(params)`` (a class or function, found by name in bot/, memory/,
storage/), ``.method(params)`` (of the last class named), ``a ; b`` several on a line, ``# …`` a
comment, ``-> …`` the result (free text), a trailing ``...`` in a parameter list: more optional
parameters not listed, ``name=`` a required keyword, ``x="a"|"b"`` the choices (the first is the
default), ``.attr`` an attribute or property.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "internals.md"
PACKAGES = ("bot", "memory", "storage")


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def _names() -> dict[str, object]:
    """Every top-level class and function of the product, by name (the first definition wins)."""
    out: dict[str, object] = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__main__":
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mod = importlib.import_module(".".join(parts))
            for name, obj in vars(mod).items():
                if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "") == mod.__name__:
                    out.setdefault(name, obj)
    return out


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets and quotes."""
    out, depth, cur, quote = [], 0, "", ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            out.append(cur)
            cur = ""
            i += len(sep)
            continue
        cur += ch
        i += 1
    out.append(cur)
    return [x.strip() for x in out if x.strip()]


def _statements(block: str) -> list[str]:
    """Logical lines: comments dropped, continuations (open brackets, ``->``) joined."""
    lines: list[str] = []
    for raw in block.splitlines():
        line = re.sub(r"\s+#.*$", "", raw) if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        if lines and (line.lstrip().startswith("->") or lines[-1].count("(") > lines[-1].count(")")):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line.strip())
    return lines


CALL = re.compile(r"^(\.?[A-Za-z_][\w.]*)(\((.*)\))?$", re.S)


def _items(statement: str):
    """(name, params or None) for each call of a statement; a chain ``A(..).m(..)`` gives both."""
    for part in _split(statement, " ; "):
        part = _split(part, "->")[0] if "->" in part else part
        part = re.sub(r"\s*->.*$", "", part, flags=re.S)
        # a chain: split at ").", keeping each call whole
        chain = re.split(r"(?<=\))(?=\.)", part)
        for call in chain:
            m = CALL.match(call.strip())
            if m:
                yield m.group(1), (m.group(3) if m.group(2) else None)


def _check(obj, params: str | None, where: str) -> list[str]:
    if params is None:
        return []
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    actual = [p for p in sig.parameters.values() if p.name not in ("self", "cls")]
    doc = _split(params, ",")
    more = bool(doc) and doc[-1] == "..."
    if more:
        doc = doc[:-1]
    problems, kw_only, i = [], False, 0
    for d in doc:
        if d == "*":
            kw_only = True
            continue
        if i >= len(actual):
            problems.append(f"{where}: documents {d!r}, the code has no more parameters")
            break
        a = actual[i]
        i += 1
        name, _, default = d.partition("=")
        name = name.lstrip("*")
        if name != a.name:
            problems.append(f"{where}: parameter {i} is {a.name!r}, documented {name!r}")
            continue
        if d.startswith("**") != (a.kind is a.VAR_KEYWORD) or (d.startswith("*") and not d.startswith("**")) != (
                a.kind is a.VAR_POSITIONAL):
            problems.append(f"{where}: {name!r} is {a.kind.description}")
        if (kw_only or "=" in d and not default) and a.kind not in (a.KEYWORD_ONLY, a.VAR_KEYWORD):
            problems.append(f"{where}: {name!r} is not keyword-only in the code")
        if not kw_only and not (d.endswith("=")) and a.kind is a.KEYWORD_ONLY:
            problems.append(f"{where}: {name!r} is keyword-only in the code (a '*' is missing)")
        has_default = bool(default)
        if has_default != (a.default is not a.empty):
            problems.append(f"{where}: {name!r} {'has no' if has_default else 'has a'} default in the code")
        elif has_default:
            first = _split(default, "|")[0]
            mod = inspect.getmodule(obj)
            g = dict(vars(mod)) if mod is not None else dict(getattr(obj, "__globals__", {}))
            try:
                value = eval(first, g)        # noqa: S307 — the project's own docs, in its own namespace
            except Exception:  # noqa: BLE001 — a default written as prose: its name only
                continue
            if value != a.default:
                problems.append(f"{where}: {name!r} defaults to {a.default!r}, documented {first}")
    if not more:
        rest = [p.name for p in actual[i:]]
        if rest:
            problems.append(f"{where}: parameters not documented (end the list with '...'): {rest}")
    return problems


def _resolve(name: str, names: dict[str, object]):
    if "." in name.strip("."):
        mod, _, attr = name.rpartition(".")
        try:
            return getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError):
            return None
    return names.get(name)


def test_every_documented_signature_is_the_code_s():
    names = _names()
    problems: list[str] = []
    checked = 0
    for block in _blocks():
        if "(" not in block or "@dataclass" in block:
            continue                # the tool port's example block is a sketch, not signatures
        owner = None
        for stmt in _statements(block):
            for name, params in _items(stmt):
                if name.startswith("."):
                    if owner is None:
                        problems.append(f"{name}: no class named before it")
                        continue
                    attr = getattr(owner, name[1:], None)
                    if attr is None:
                        problems.append(f"{owner.__name__}{name}: no such member")
                        continue
                    problems += _check(attr, params, f"{owner.__name__}{name}")
                    checked += 1
                    continue
                obj = _resolve(name, names)
                if obj is None:
                    problems.append(f"{name}: not found in {PACKAGES}")
                    continue
                if inspect.isclass(obj):
                    owner = obj
                problems += _check(obj, params, name)
                checked += 1
    assert checked > 60, checked
    assert not problems, "docs/internals.md differs from the code:\n" + "\n".join(problems)


def test_every_module_path_it_names_exists():
    missing = sorted({p for p in re.findall(r"`((?:bot|memory|storage|tests|bench)/[\w/]+\.py)", DOC.read_text())
                      if not (ROOT / p).exists()})
    assert not missing, f"docs/internals.md names files that do not exist: {missing}"


@pytest.mark.parametrize("doc, code, found", [
    ("f(a, *, b=2)", "def f(a, *, b=2): ...", False),
    ("f(a, b=3)", "def f(a, *, b=2): ...", True),            # not keyword-only, wrong default
    ("f(a, ...)", "def f(a, *, b=2): ...", False),
    ("f(a)", "def f(a, *, b=2): ...", True),                  # b not documented
    ("f(x)", "def f(a): ...", True),
])
def test_the_checker_sees_a_false_signature(doc, code, found, tmp_path):
    ns: dict = {}
    exec(code, ns)                      # noqa: S102 — a sample
    m = CALL.match(doc)
    assert bool(_check(ns["f"], m.group(3), "f")) is found


MAP = "## Where things live"


def _map(text: str) -> str:
    return text.split(MAP, 1)[1].split("\n## ", 1)[0] if MAP in text else ""


def map_problems(root: Path, text: str) -> list[str]:
    """The map opens the page, names every package folder of the product, and names nothing
    that is not there (issue 46: the tree alone answers "where does X live")."""
    headings = re.findall(r"^## .*$", text, re.M)
    if not headings or not headings[0].startswith(MAP):
        return [f"the page must open with {MAP!r}"]
    table = _map(text)
    folders = {p.parent.relative_to(root).as_posix() + "/" for pkg in PACKAGES
               for p in (root / pkg).rglob("__init__.py")}
    named = set(re.findall(r"`((?:bot|memory|storage)(?:/[\w]+)*/)`", table))
    paths = set(re.findall(r"`((?:bot|memory|storage)/[\w/]+\.py)`", table))
    return ([f"folder not in the map: {f}" for f in sorted(folders - named)]
            + [f"the map names a folder that is not a package: {f}" for f in sorted(named - folders)]
            + [f"the map names a missing file: {p}" for p in sorted(paths) if not (root / p).is_file()])


def test_the_page_opens_with_the_map_of_every_folder():
    problems = map_problems(ROOT, DOC.read_text())
    assert not problems, "\n".join(problems)


def test_the_map_check_sees_a_missing_and_a_stale_folder(tmp_path):
    for rel in ("bot/__init__.py", "bot/core/__init__.py", "bot/media/__init__.py", "memory/__init__.py",
                "storage/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    page = ("# Internals\n\n## Where things live\n\n| a | `bot/`, `bot/core/`, `bot/old/`, `bot/core/gone.py` |\n"
            "| b | `memory/`, `storage/` |\n\n## Flow\n")
    assert map_problems(tmp_path, page) == ["folder not in the map: bot/media/",
                                            "the map names a folder that is not a package: bot/old/",
                                            "the map names a missing file: bot/core/gone.py"]
    assert map_problems(tmp_path, page.replace("## Where things live", "## Flow first\n\n## Where things live")) \
        == [f"the page must open with {MAP!r}"]
