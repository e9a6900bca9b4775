"""pyproject.toml: every dependency has a bounded range and a line in README's "Dependencies,
and why each is there" (issue 16: say why each dependency is there)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def requirements() -> list[tuple[str, Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    out = [("build-system", Requirement(r)) for r in project["build-system"]["requires"]]
    out += [("dependencies", Requirement(r)) for r in project["project"]["dependencies"]]
    for extra, reqs in project["project"]["optional-dependencies"].items():
        out += [(extra, Requirement(r)) for r in reqs]
    return out


def test_every_dependency_has_a_lower_and_an_upper_bound():
    reqs = requirements()
    assert len(reqs) > 20
    unbounded = [f"{where}: {r}" for where, r in reqs
                 if not any(s.operator in ("<", "==", "~=") for s in r.specifier)
                 or not any(s.operator in (">=", "==", "~=") for s in r.specifier)]
    assert not unbounded, f"give these a tested lower bound and an upper bound: {unbounded}"


def test_readme_says_why_each_dependency_is_there():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Dependencies, and why each is there"):]
    table = table[:table.index("\n## ")]
    named = {re.sub(r"\[.*\]", "", n).lower() for n in re.findall(r"`([A-Za-z0-9_.\[\]-]+)`", table)}
    missing = sorted({r.name for where, r in requirements() if where != "build-system"}
                     - named, key=str.lower)
    missing = [m for m in missing if m.lower() not in named]
    assert not missing, f"README's dependency table does not say why {missing} is there"
