"""A newcomer's first hour (issue 30): what the README and the Makefile promise is what they do.
The two commands, what `make test` needs, where `ethan` lives — read from the files and run."""

from __future__ import annotations

import os
import re
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


def test_the_preflight_passes_here():
    r = subprocess.run([sys.executable, "-m", "tests.preflight"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr


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
