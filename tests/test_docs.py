"""A newcomer's first hour (issue 30): what the README and the Makefile promise is what they do.
The two commands, what `make test` needs, where `ethan` lives — read from the files and run."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()


def _two_commands() -> str:
    return README.split("## Two commands", 1)[1].split("\n## ", 1)[0]


def _make(*args: str, **env: str) -> subprocess.CompletedProcess:
    # -o: the venv is what it is (no reinstall from a test)
    return subprocess.run(["make", "-s", "-o", ".venv/.installed", "-o", ".venv/.runtime", "-o", ".venv/bin/python",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_make_help_lists_the_targets():
    r = _make("help")
    assert r.returncode == 0, r.stderr
    for target in ("run", "test", "test-quick", "bench", "clean"):
        assert re.search(rf"^\s*make {target}\s+\S", r.stdout, re.M), r.stdout


@pytest.mark.parametrize("env,needle", [
    ({"ETHAN_CHROMIUM": "/nonexistent/chromium"}, "Chromium"),
    ({"ETHAN_PG_BINDIR": "/nonexistent/pg/bin"}, "PostgreSQL"),
])
def test_make_test_names_what_it_needs_in_one_line(env, needle):
    r = _make("test", PYTEST_ARGS="--collect-only -q tests/test_docs.py", **env)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if not line.startswith(("make:", "make["))]
    assert len(lines) == 1 and lines[0].startswith("make test needs: ") and needle in lines[0], r.stderr
    assert "collected" not in r.stdout, "the suite ran although something it needs is missing"


def _stub(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_the_preflight_needs_postgresql_and_chromium_but_not_libfaketime(tmp_path):
    """The README calls libfaketime optional ("skipped without it"): with PostgreSQL's binaries
    and Chromium present and libfaketime hidden, `make test`'s preflight passes with one note."""
    bindir = tmp_path / "pg"
    for name in ("initdb", "pg_ctl"):
        _stub(bindir / name)
    env = {**os.environ, "ETHAN_PG_BINDIR": str(bindir), "ETHAN_CHROMIUM": str(_stub(tmp_path / "chromium")),
           "ETHAN_FAKETIME": str(tmp_path / "no-libfaketime.so.1")}
    r = subprocess.run([sys.executable, "-m", "tests.preflight"], cwd=ROOT, capture_output=True, text=True, env=env)
    if os.geteuid() == 0 and "`postgres` user" in r.stderr:
        pytest.skip("root without a postgres user: the preflight rightly asks for one")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "libfaketime not found" in r.stdout and "skipped" in r.stdout, r.stdout


def _quick_pytest_args() -> list[str]:
    """The pytest arguments of the Makefile's `test-quick` recipe (after `-m pytest`)."""
    recipe = re.search(r"^test-quick:.*\n\t(.*)$", MAKEFILE, re.M).group(1)
    args = shlex.split(recipe.split("-m pytest", 1)[1].replace("$(PYTEST_ARGS)", ""))
    assert "-m" in args and "slow" in args[args.index("-m") + 1], args
    return args


@pytest.mark.slow       # the quick subset itself, once (~1 min); excluded from it, so it never recurses
def test_the_quick_subset_passes_without_postgresql_chromium_or_libfaketime(tmp_path):
    """Issue 52: `make test-quick` failed on a machine with only Python and make. Its pytest
    command, run here with PostgreSQL's binaries, Chromium and libfaketime all out of reach
    (named paths that do not exist, and a PATH of the usual tools without any of them)."""
    path = tmp_path / "bin"
    path.mkdir()
    hidden = re.compile(r"^(chrom|pg_|postgres|initdb|psql|faketime|playwright)")
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        for tool in (Path(folder).iterdir() if Path(folder).is_dir() else ()):
            if not hidden.match(tool.name) and not (path / tool.name).exists():
                (path / tool.name).symlink_to(tool)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETHAN_", "PG"))}
    env.update(PATH=str(path), ETHAN_PG_BINDIR=str(tmp_path / "no-pg"),
               ETHAN_CHROMIUM=str(tmp_path / "no-chromium"), ETHAN_FAKETIME=str(tmp_path / "no-faketime.so.1"),
               PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *_quick_pytest_args()],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    tail = "\n".join(r.stdout.splitlines()[-30:])
    assert r.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail, tail


def test_make_run_installs_the_runtime_only():
    run = re.search(r"^run:\s*(\S+)", MAKEFILE, re.M).group(1)
    assert run == "$(RUNTIME)"
    recipe = re.search(r"^\$\(RUNTIME\):.*\n((?:\t.*\n)+)", MAKEFILE, re.M).group(1)
    assert "pip install" in recipe and "[" not in recipe, recipe
    test_recipe = re.search(r"^test:\s*(\S+)", MAKEFILE, re.M).group(1)
    assert test_recipe == "$(STAMP)"


def test_the_editable_install_uses_the_plain_pth_layout():
    # setuptools' import-hook strategy (a flat layout without package-dir) prints a warning box
    # on every `make run`; package-dir "" = "." makes it a plain .pth of the checkout.
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["package-dir"] == {"": "."}


def test_two_commands_say_what_a_fresh_machine_needs():
    text = _two_commands()
    for needle in ("PostgreSQL", "Chromium", "ETHAN_PG_BINDIR", "ETHAN_CHROMIUM", "make help",
                   "make test-quick", "minutes", ".venv/bin/ethan", "make test needs:"):
        assert needle in text, f"README 'Two commands' does not say {needle!r}"
    assert re.search(r"^test-quick:", MAKEFILE, re.M)
    assert "ETHAN_PG_BINDIR" in (ROOT / "tests" / "pg_cluster.py").read_text()
    assert "ETHAN_CHROMIUM" in (ROOT / "tests" / "web" / "conftest.py").read_text()


def test_the_readme_cites_only_files_in_the_repository():
    """Links and named docs (`DESIGN.md`, docs/…) must exist in a clone."""
    missing = []
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        if not (ROOT / target).exists():
            missing.append(target)
    # a path (docs/x.md) or an upper-case document name (DESIGN.md); user_profile.md is an export's file
    for name in re.findall(r"\b((?:[\w.-]+/)+[\w.-]+\.md|[A-Z][A-Z_]+\.md)\b", README):
        if not (ROOT / name).exists() and not list(ROOT.glob(f"*/{name}")):
            missing.append(name)
    assert not missing, f"README.md cites files that are not in the repository: {sorted(set(missing))}"


# -- the docs agree with the code and the latest bench (issue 30 item 13) -------------------------

OPERATIONS = (ROOT / "docs" / "operations.md").read_text()


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end > 0 else None]


_SCOPE = re.compile(r"`((?:im|cardkit|contact):[a-z_.]+(?::[a-z_]+)?)`")


def test_the_scopes_of_the_readme_and_the_operations_guide_agree():
    readme = _section(README, "## Connecting Lark / Feishu")
    guide = _section(OPERATIONS, "## 1. Create the Lark/Feishu app")
    in_readme, in_guide = set(_SCOPE.findall(readme)), set(_SCOPE.findall(guide))
    assert len(in_readme) >= 6
    assert in_readme == in_guide, (f"README only: {sorted(in_readme - in_guide)}; "
                                   f"docs/operations.md §1 only: {sorted(in_guide - in_readme)}")
    batch = json.loads(re.search(r"```json\n(.*?)```", guide, re.S).group(1))["scopes"]["tenant"]
    table = {m.group(1) for m in re.finditer(r"^\s*\| `([a-z]+:[a-z_.:]+)` \|", guide, re.M)}
    assert table <= set(batch), f"the batch-import JSON lacks {sorted(table - set(batch))}"


def test_every_scope_the_code_names_is_documented_in_both_places():
    """A scope a module asks for (a log line's ``missing_scope``, an answer naming it) is in
    the README's permission list and docs/operations.md §1, which say what happens without it."""
    code = "\n".join(p.read_text() for p in (ROOT / "bot").rglob("*.py"))
    named = set(re.findall(r"\b((?:im|cardkit|contact):[a-z_.]+(?::[a-z_]+)?)", code))
    assert {"im:message.group_msg", "im:message:readonly", "im:chat:readonly"} <= named, named
    readme = _section(README, "## Connecting Lark / Feishu")
    guide = _section(OPERATIONS, "## 1. Create the Lark/Feishu app")
    for name, text in (("README 'Connecting Lark / Feishu'", readme), ("docs/operations.md §1", guide)):
        missing = sorted(sc for sc in named if f"`{sc}`" not in text)
        assert not missing, f"{name} does not list the scopes {missing}, which bot/ names"


def test_every_event_the_code_handles_is_documented_in_both_places():
    code = "\n".join(p.read_text() for p in (ROOT / "bot" / "lark").rglob("*.py"))
    events = set(re.findall(r'"((?:im|card)\.[a-z_.]+?(?:_v\d+|\.trigger))"', code))
    assert {"im.message.receive_v1", "im.message.recalled_v1", "card.action.trigger"} <= events, events
    readme = _section(README, "## Connecting Lark / Feishu")
    guide = _section(OPERATIONS, "## 1. Create the Lark/Feishu app")
    for name, text in (("README 'Connecting Lark / Feishu'", readme), ("docs/operations.md §1", guide)):
        missing = sorted(e for e in events if f"`{e}`" not in text)
        assert not missing, f"{name} does not list the events {missing}, which bot/lark handles"


def test_the_postgresql_ratio_is_the_latest_bench():
    bench = (ROOT / "bench" / "README.md").read_text()
    # the latest measurement: bench scale's (§16) one-replica ratio (§16 is newest first)
    latest = re.findall(r"^- \*\*PostgreSQL one replica / SQLite: (\d\.\d+)×\*\*", bench, re.M)[:1]
    assert latest, "bench/README.md §16 states no PostgreSQL / SQLite ratio"
    stated = re.findall(r"[Oo]ne\s+replica is not faster than SQLite: on\s+the same 2 cores it measured (\d\.\d+)×",
                        OPERATIONS)
    stated += re.findall(r"one replica (\d\.\d+)× SQLite's messages/s", README)
    assert len(stated) >= 2 and set(stated) == {latest[0]}, (stated, latest[0])


def test_the_offline_model_is_not_described_as_a_missing_anthropic_key():
    texts = {"README.md": README, "docs/operations.md": OPERATIONS,
             "docs/console.md": (ROOT / "docs" / "console.md").read_text(),
             "bot/infra/cli/__init__.py": (ROOT / "bot" / "infra" / "cli" / "__init__.py").read_text()}
    wrong = re.compile(r"(?:no|without)\s+`?ANTHROPIC_API_KEY`?(?:\s+in the env file)?\s*(?:[:)(|]|the built-in)|"
                       r"`?ANTHROPIC_API_KEY`?\s+empty to use the built-in offline", re.I)
    bad = {name: m.group(0) for name, text in texts.items() for m in [wrong.search(text)] if m}
    assert not bad, f"the offline model runs when no model at all is configured: {bad}"


async def test_the_offline_healthz_example_is_what_the_server_answers(tmp_path):
    from bot.app import EthanApp
    from tests.web.conftest import offline_settings
    import aiohttp

    example = json.loads(re.search(r"Expected `/healthz` body of step 2.*?```json\n(.*?)\n```",
                                   OPERATIONS, re.S).group(1))
    from tests.reliability.support import LogCapture

    app = EthanApp(offline_settings(tmp_path, ethan_model=""))
    with LogCapture() as logs:
        await app.start()
    try:
        async with aiohttp.ClientSession() as http, http.get(app.base_url + "/healthz") as r:
            real = await r.json()
    finally:
        await app.stop()
    # (issue 52) the offline model is nobody's Anthropic: "offline" in app.ready and /healthz
    [ready] = logs.events("app.ready")
    assert ready["provider"] == "offline" and ready["model"] == "ethan-offline", ready
    assert set(example) == set(real), (sorted(set(example) ^ set(real)))
    for key in ("status", "ready", "database", "transport", "model", "provider", "model_ok", "offline_model"):
        assert example[key] == real[key], (key, example[key], real[key])


_NOT_SETTINGS = {"ETHAN_CHROMIUM", "ETHAN_PG_BINDIR", "ETHAN_FAKETIME", "ETHAN_CI_IN_CLONE"}   # the test suite's own


def test_every_documented_setting_is_read_by_the_code_and_every_setting_is_documented():
    from bot.infra.config import Settings

    # config.yaml-only mappings (providers:, mcp_servers:, tools:) are not environment variables
    fields = {name.upper() for name in Settings.model_fields
              if name.startswith(("ethan_", "lark_", "anthropic_", "openai_"))}
    env_example = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", (ROOT / ".env.example").read_text(), re.M))
    undocumented = sorted(fields - env_example)
    assert not undocumented, f".env.example does not document {undocumented}"
    docs = {"README.md": README, "docs/operations.md": OPERATIONS, ".env.example": (ROOT / ".env.example").read_text(),
            **{f"docs/{p.name}": p.read_text() for p in (ROOT / "docs").glob("*.md")}}
    unknown = {}
    for name, text in docs.items():
        for var in set(re.findall(r"\b((?:ETHAN|LARK)_[A-Z0-9_]*[A-Z0-9])\b", text)):
            if var not in fields and var not in _NOT_SETTINGS:
                unknown.setdefault(name, []).append(var)
    assert not unknown, f"documented variables that bot/infra/config/ does not read: {unknown}"
