"""The deploy files agree with the code and with each other.

No image is built here (there is no Docker engine on CI); instead the Dockerfile, compose.yaml
and the systemd unit are parsed and checked against what the code and the README define:
the command `make run` runs, the variables `.env.example` documents, the shutdown deadline of
``bot.infra.config.Settings``, the /livez route. The container's command and its HEALTHCHECK are
then run for real against a local `ethan serve`.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bot.infra.config import ConfigError, Settings, load_settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"                 # scaled out: PostgreSQL, two replicas, a balancer
COMPOSE_SINGLE = DEPLOY / "compose.single.yaml"   # one process on SQLite
UNIT = DEPLOY / "ethan.service"
OPERATIONS = ROOT / "docs" / "operations.md"

# Between SIGTERM and exit Ethan drains replies for up to ETHAN_SHUTDOWN_DEADLINE, then gives
# consolidation at least 1 s, the HTTP runner up to 2 s, then closes clients and the database.
SHUTDOWN_OVERHEAD_S = 5.0


# --- small parsers -----------------------------------------------------------------------------

class Instruction:
    def __init__(self, cmd: str, args: str, stage: int, line: int) -> None:
        self.cmd, self.args, self.stage, self.line = cmd, args, stage, line

    def __repr__(self) -> str:
        return f"{self.cmd} {self.args} (line {self.line})"


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped; ``stage`` counts FROMs."""
    out: list[Instruction] = []
    stage, buf, start = -1, "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):          # comment inside a continued instruction
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        cmd, _, args = buf.partition(" ")
        cmd = cmd.upper()
        if cmd == "FROM":
            stage += 1
        out.append(Instruction(cmd, args.strip(), stage, start))
        buf = ""
    assert not buf, "Dockerfile ends inside a continued line"
    return out


def final_stage(instrs: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instrs)
    return [i for i in instrs if i.stage == last]


def one(instrs: list[Instruction], cmd: str) -> Instruction:
    found = [i for i in instrs if i.cmd == cmd]
    assert len(found) == 1, f"expected exactly one {cmd} in the final stage, found {found}"
    return found[0]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(a, str) for a in value), args
    return value


def healthcheck_command(instr: Instruction) -> tuple[dict[str, str], list[str]]:
    """HEALTHCHECK [--opt=value ...] CMD <exec form> -> (options, argv)."""
    opts, rest = {}, instr.args
    while rest.startswith("--"):
        opt, _, rest = rest.partition(" ")
        k, _, v = opt[2:].partition("=")
        opts[k] = v
        rest = rest.lstrip()
    kind, _, command = rest.partition(" ")
    assert kind.upper() == "CMD", f"HEALTHCHECK must run a command: {instr}"
    assert command.lstrip().startswith("["), "use the exec form: no shell needed in the image"
    return opts, exec_form(command)


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd unit -> {section: {key: [values...]}} (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"key outside a section: {line}"
        k, sep, v = line.partition("=")
        assert sep, f"not a key=value line: {line}"
        current.setdefault(k.strip(), []).append(v.strip())
    return sections


def seconds(value: str | int | float) -> float:
    """Docker/compose ('30s', '1m30s') and systemd ('30', '30s', '1min 30s') durations."""
    if isinstance(value, (int, float)):
        return float(value)
    text = value.replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|sec|min|hr|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"unreadable duration {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


def make_target_command(target: str) -> list[str]:
    """The last recipe line of a Makefile target, with `$(VAR)/` prefixes dropped."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"^{re.escape(target)}\s*:(?!=)", line):
            recipe = []
            for follow in lines[i + 1:]:
                if not follow.startswith("\t"):
                    break
                recipe.append(follow.strip().lstrip("@-"))
            assert recipe, f"make {target} has no recipe"
            argv = shlex.split(recipe[-1])
            return [re.sub(r"^(\$\([A-Z_]+\)/)+", "", argv[0]), *argv[1:]]
    raise AssertionError(f"no `{target}:` target in the Makefile")


def documented_variables() -> list[str]:
    names = re.findall(r"^([A-Z][A-Z0-9_]*)=", (ROOT / ".env.example").read_text(), re.M)
    assert len(names) >= 10, names
    return names


def shutdown_deadline_default() -> float:
    return float(Settings.model_fields["ethan_shutdown_deadline"].default)


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


REPLICAS = ("ethan-1", "ethan-2")
SERVICES = {"postgres", *REPLICAS, "balancer"}
HAPROXY = DEPLOY / "haproxy.cfg"


@pytest.fixture(scope="module")
def compose() -> dict:
    value = yaml.safe_load(COMPOSE.read_text())     # a YAML error fails every test using it
    assert isinstance(value, dict) and isinstance(value.get("services"), dict), "not a compose file"
    return value


@pytest.fixture(scope="module")
def replicas(compose) -> list[dict]:
    """The `ethan serve` services of compose.yaml (two, on PostgreSQL, behind the balancer)."""
    assert set(compose["services"]) == SERVICES, sorted(compose["services"])
    return [compose["services"][name] for name in REPLICAS]


@pytest.fixture(scope="module")
def single() -> dict:
    """compose.single.yaml's one `ethan serve` (SQLite on its volume)."""
    value = yaml.safe_load(COMPOSE_SINGLE.read_text())
    assert list(value["services"]) == ["ethan"]
    return value["services"]["ethan"]


@pytest.fixture(scope="module")
def servers(replicas, single) -> list[dict]:
    """Every `ethan serve` service of both compose files."""
    return [*replicas, single]


@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    return parse_unit(UNIT.read_text())


# --- the command -------------------------------------------------------------------------------

def test_container_runs_the_command_make_run_runs(dockerfile, servers, unit):
    run = make_target_command("run")
    assert run == ["ethan", "serve"]
    cmd = exec_form(one(final_stage(dockerfile), "CMD").args)
    assert cmd == run, f"Dockerfile CMD {cmd} is not what `make run` runs ({run})"
    assert not any(i.cmd == "ENTRYPOINT" for i in dockerfile), "an ENTRYPOINT would change the command"
    # compose keeps the image's command (or repeats it exactly), on every replica
    for service in servers:
        assert service.get("command", cmd) == cmd
    # systemd runs the same command from the install's virtualenv
    [exec_start] = unit["Service"]["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv == ["/opt/ethan/.venv/bin/ethan", "serve"]
    assert [Path(argv[0]).name, *argv[1:]] == run


def test_readme_says_make_run():
    readme = ROOT / "README.md"
    if not readme.exists():
        pytest.skip("README.md is not written yet")
    assert re.search(r"^\s*make run\b", readme.read_text(), re.M), "README should show `make run`"


# --- configuration -----------------------------------------------------------------------------

# .env.example's variables that only compose.yaml reads (its PostgreSQL container's password)
COMPOSE_ONLY = {"POSTGRES_PASSWORD"}


def test_compose_and_unit_name_every_documented_variable():
    names = documented_variables()
    for path in (COMPOSE, COMPOSE_SINGLE, UNIT):
        text = path.read_text()
        missing = [n for n in names if not re.search(rf"\b{n}\b", text)
                   and (n not in COMPOSE_ONLY or path == COMPOSE)]
        assert not missing, f"{path.relative_to(ROOT)} does not mention {missing} (.env.example documents them)"


def test_env_example_names_every_variable_compose_needs():
    """`--env-file .env` fills compose's ${VAR}s: each one a new user must set is in the template."""
    needed = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)(?::?\?)", COMPOSE.read_text()))
    assert "POSTGRES_PASSWORD" in needed
    missing = needed - set(documented_variables())
    assert not missing, f".env.example does not name {sorted(missing)}, which deploy/compose.yaml requires"


def test_fixed_environment_entries_are_real_settings(dockerfile, servers, unit):
    fields = {name.upper() for name in Settings.model_fields}
    image_env = _dockerfile_env(dockerfile)
    unit_env = dict(e.split("=", 1) for e in unit["Service"].get("Environment", []))
    for where, env in (("Dockerfile ENV", image_env), *(("compose environment", s["environment"]) for s in servers),
                       ("unit Environment=", unit_env)):
        unknown = [k for k in env if k.startswith(("ETHAN_", "LARK_", "ANTHROPIC_")) and k not in fields]
        assert not unknown, f"{where} sets {unknown}, which bot/infra/config/ does not read"


def _dockerfile_env(dockerfile: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for i in final_stage(dockerfile):
        if i.cmd == "ENV":
            for token in shlex.split(i.args):
                k, sep, v = token.partition("=")
                assert sep, f"use ENV KEY=value: {i}"
                env[k] = v
    return env


def test_data_lives_on_a_volume(dockerfile, servers, unit):
    stage = final_stage(dockerfile)
    env = _dockerfile_env(dockerfile)
    assert env["ETHAN_HOME"] == "/data"
    volumes = [v for i in stage if i.cmd == "VOLUME" for v in exec_form(i.args)]
    assert "/data" in volumes
    homes = []
    for service in servers:
        assert service["environment"]["ETHAN_HOME"] == "/data"
        [home] = [str(v).split(":")[0] for v in service["volumes"] if str(v).split(":")[1] == "/data"]
        homes.append(home)
    assert len(set(homes)) == len(homes), f"each replica has a /data volume of its own: {homes}"
    s = unit["Service"]
    assert s["StateDirectory"] == ["ethan"]
    assert "/var/lib/ethan" in " ".join(s["ReadWritePaths"])
    assert "ETHAN_HOME=/var/lib/ethan" in s["Environment"]


def test_container_listens_on_all_interfaces_but_publishes_on_loopback(dockerfile, replicas, single, compose):
    """In a container the server must bind 0.0.0.0, which Ethan allows only with a console
    token: the token comes from .env (env_file), and the host side stays on 127.0.0.1 — the
    replicas publish nothing; the balancer's one port is on the host's loopback."""
    assert _dockerfile_env(dockerfile)["ETHAN_HOST"] == "0.0.0.0"
    with pytest.raises(ConfigError, match="ETHAN_CONSOLE_TOKEN"):
        load_settings(_env_file=None, ethan_host="0.0.0.0", ethan_console_token="")
    for service in replicas:
        assert service["environment"]["ETHAN_HOST"] == "0.0.0.0"
        assert service["env_file"], "the token and the app's secrets come from .env"
        assert not service.get("ports"), "replicas are reached through the balancer only"
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: publish on the host's loopback only: {port}"
    assert compose["services"]["balancer"]["ports"]
    assert single["environment"]["ETHAN_HOST"] == "0.0.0.0" and single["env_file"]
    for port in single["ports"]:
        assert str(port).startswith("127.0.0.1:"), f"publish on the host's loopback only: {port}"
    assert "ETHAN_CONSOLE_TOKEN" in OPERATIONS.read_text()


# --- scaled out: PostgreSQL, two replicas, one balancer -----------------------------------------

def _interpolated(value: str, **env: str) -> str:
    """Compose's ${NAME}, ${NAME:-default}, ${NAME:?error} with ``env``."""
    def sub(m):
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        if name in env:
            return env[name]
        assert op != ":?", f"${{{name}}} is required: {arg}"
        return arg
    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", sub, str(value))


def test_the_deploy_readme_lists_every_file_in_the_folder():
    """deploy/README.md's table names each file of deploy/ once, and only those (issue 52: it
    left out compose.single.yaml, the file docs/operations.md recommends)."""
    listed = re.findall(r"^\| `([^`]+)` \|", (DEPLOY / "README.md").read_text(), re.M)
    present = sorted(p.name for p in DEPLOY.iterdir() if p.is_file() and p.name != "README.md")
    assert sorted(listed) == present, (sorted(listed), present)


def test_existing_single_deployments_keep_their_volume(compose, single):
    """compose.yaml was the one-process file until it scaled out: compose.single.yaml keeps its
    project name and volume, so `docker compose -f deploy/compose.single.yaml up` finds the
    same database (ethan_ethan-data) — and compose.yaml, another project, cannot touch it."""
    value = yaml.safe_load(COMPOSE_SINGLE.read_text())
    assert value["name"] == "ethan" and "ethan-data:/data" in single["volumes"]
    assert compose["name"] != value["name"]


def test_postgres_service_is_the_official_debian_image_on_a_volume_with_a_healthcheck(compose):
    pg = compose["services"]["postgres"]
    image = pg["image"]
    assert re.fullmatch(r"postgres:\d+(\.\d+)?-(bookworm|bullseye|trixie)", image), \
        f"the official postgres image, its Debian variant: {image}"
    assert any(str(v).split(":")[1] == "/var/lib/postgresql/data" and not str(v).startswith((".", "/"))
               for v in pg["volumes"]), "the cluster lives on a named volume"
    assert str(pg["volumes"][0]).split(":")[0] in compose["volumes"]
    test = pg["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "pg_isready", test
    assert seconds(pg["healthcheck"]["timeout"]) < seconds(pg["healthcheck"]["interval"])
    assert not pg.get("ports"), "PostgreSQL stays on the compose network"
    assert "${POSTGRES_PASSWORD:?" in pg["environment"]["POSTGRES_PASSWORD"], "no default password"


def test_two_replicas_share_the_postgres_database_with_distinct_ids(compose, replicas):
    pg_env = compose["services"]["postgres"]["environment"]
    ids = []
    for name, service in zip(REPLICAS, replicas):
        env = {k: _interpolated(v, POSTGRES_PASSWORD="s3cret") for k, v in service["environment"].items()}
        url = env["ETHAN_DATABASE_URL"]
        # the password beside the URL, as libpq's PGPASSWORD: compose cannot URL-encode it (issue 52;
        # tests/memory/test_pg_connection_errors.py logs in with one that has / + @ :)
        assert url == (f"postgresql://{pg_env['POSTGRES_USER']}@postgres:5432/{pg_env['POSTGRES_DB']}"), url
        assert env["PGPASSWORD"] == "s3cret"
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert service["image"] == "ethan:latest" and service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert float(env["ETHAN_LEASE_SECONDS"]) > 0
        ids.append(env["ETHAN_REPLICA_ID"])
        # what the code makes of the replica's environment: PostgreSQL at that URL
        settings = load_settings(_env_file=None, ethan_console_token="t" * 32,
                                 **{k.lower(): v for k, v in env.items() if k.startswith("ETHAN_")})
        assert settings.database_target == url
        assert settings.replica_id == name and settings.ethan_lease_seconds == float(env["ETHAN_LEASE_SECONDS"])
    assert ids == list(REPLICAS), "each replica names itself (the owner on the rows it accepts)"


def test_pools_fit_in_max_connections(compose, replicas):
    command = compose["services"]["postgres"]["command"]
    max_connections = int(command[command.index("-c") + 1].split("=")[1]) if "-c" in command else 100
    env_example = dict(re.findall(r"^([A-Z][A-Z0-9_]*)=(.*)$", (ROOT / ".env.example").read_text(), re.M))
    pool = int(env_example.get("ETHAN_DATABASE_POOL") or Settings.model_fields["ethan_database_pool"].default)
    reserved = 3 + 5      # superuser_reserved_connections, and room for psql / pg_dump / ethan db copy
    assert pool * len(replicas) <= max_connections - reserved, (pool, len(replicas), max_connections)


def _haproxy() -> dict[str, list[str]]:
    """haproxy.cfg -> {section header: [its lines]}, comments dropped."""
    sections: dict[str, list[str]] = {}
    current = None
    for raw in HAPROXY.read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not raw[0].isspace():
            current = sections.setdefault(line.strip(), [])
        else:
            assert current is not None, raw
            current.append(" ".join(line.split()))
    return sections


def test_one_balancer_spreads_requests_over_the_healthy_replicas(compose, replicas):
    lb = compose["services"]["balancer"]
    assert re.fullmatch(r"haproxy:\d+(\.\d+)*", lb["image"]), "the official HAProxy image (Debian variant)"
    [mount] = lb["volumes"]
    src, dest = str(mount).split(":")[:2]
    assert (DEPLOY / src).resolve() == HAPROXY and dest == "/usr/local/etc/haproxy/haproxy.cfg"
    cfg = _haproxy()
    [frontend] = [k for k in cfg if k.startswith("frontend ")]
    [bind] = [ln for ln in cfg[frontend] if ln.startswith("bind ")]
    listen = bind.split(":")[-1]
    [published] = lb["ports"]
    assert str(published).rsplit(":", 1)[1] == listen, "the published port is the frontend's"
    [backend] = [k for k in cfg if k.startswith("backend ")]
    lines = cfg[backend]
    assert "balance roundrobin" in lines
    # liveness, not readiness (issue 52): /healthz is 503 on every replica at once while the
    # model or Lark is down, which emptied the pool and hid the console; /livez says "serving"
    # unless the replica is starting or draining (tests/e2e/test_metrics.py checks the word)
    assert "option httpchk GET /livez" in lines and "http-check expect string serving" in lines
    assert not [ln for ln in lines if "/healthz" in ln], lines
    servers = [ln.split() for ln in lines if ln.startswith("server ")]
    assert [(s[1], s[2]) for s in servers] == [(n, f"{n}:{r['environment']['ETHAN_PORT']}")
                                              for n, r in zip(REPLICAS, replicas)]
    checked = [ln for ln in lines if ln.startswith("default-server")] + [" ".join(s) for s in servers]
    assert any(re.search(r"\bcheck\b", ln) for ln in checked), "servers are health-checked"
    # the replicas believe X-Forwarded-For from the balancer's address, and only from known hops
    assert "option forwardfor" in cfg["defaults"]
    address = lb["networks"]["ethan"]["ipv4_address"]
    subnet = ipaddress.ip_network(compose["networks"]["ethan"]["ipam"]["config"][0]["subnet"])
    assert ipaddress.ip_address(address) in subnet
    for service in replicas:
        trusted = service["environment"]["ETHAN_TRUSTED_PROXIES"].split(",")
        assert address in trusted and all(ipaddress.ip_address(t) in subnet for t in trusted), trusted
    # answers can stream for the whole reply deadline: the balancer must not cut them short
    timeout = [ln for ln in cfg["defaults"] if ln.startswith("timeout server")][0].split()[-1]
    assert seconds(timeout) > float(Settings.model_fields["ethan_reply_deadline"].default)


# --- health, signals, users -------------------------------------------------------------------

def test_healthchecks_ask_livez(dockerfile, servers):
    """Docker's health is liveness (issue 52): a container "unhealthy" for a model or Lark
    outage kept Caddy (`depends_on: service_healthy`) from starting and hid the console."""
    opts, argv = healthcheck_command(one(final_stage(dockerfile), "HEALTHCHECK"))
    assert argv[0] in ("python", "python3"), "python:*-slim has no curl or wget"
    assert "/livez" in " ".join(argv) and "/healthz" not in " ".join(argv)
    for service in servers:      # a compose healthcheck of its own would replace the image's
        assert "/healthz" not in json.dumps(service.get("healthcheck", {})), service["healthcheck"]
    assert seconds(opts["timeout"]) < seconds(opts["interval"])
    assert seconds(opts.get("start-period", "0s")) >= 10, "startup (imports, migrations) takes seconds"


def test_stop_signal_is_sigterm(dockerfile, servers, unit):
    assert one(final_stage(dockerfile), "STOPSIGNAL").args == "SIGTERM"
    for service in servers:
        assert service.get("stop_signal", "SIGTERM") == "SIGTERM"
    assert unit["Service"]["KillSignal"] == ["SIGTERM"]


def test_stop_grace_outlasts_the_shutdown_deadline(servers, unit):
    deadline = shutdown_deadline_default()
    assert deadline > 0
    unit_grace = seconds(unit["Service"]["TimeoutStopSec"][0])
    for where, grace in (*(("compose stop_grace_period", seconds(s["stop_grace_period"])) for s in servers),
                         ("unit TimeoutStopSec", unit_grace)):
        assert grace >= deadline + SHUTDOWN_OVERHEAD_S, \
            f"{where} = {grace}s: SIGKILL would cut the {deadline}s shutdown deadline short"


def test_runs_as_an_unprivileged_user(dockerfile, servers, unit):
    stage = final_stage(dockerfile)
    user = one(stage, "USER").args.split(":")[0]
    assert user not in ("root", "0"), "the server must not run as root"
    user_line = one(stage, "USER").line
    assert any(i.cmd == "RUN" and "useradd" in i.args and i.line < user_line for i in stage), \
        "create the user before switching to it"
    assert [i.cmd for i in stage].index("USER") < [i.cmd for i in stage].index("CMD")
    for service in servers:
        assert "user" not in service or service["user"] not in ("root", "0")
    s = unit["Service"]
    assert s["User"] == ["ethan"]
    for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                       ("PrivateTmp", "yes"), ("Restart", "on-failure")):
        assert s.get(key) == [value], f"unit: {key}={value}"
    assert s["EnvironmentFile"] == ["/etc/ethan/ethan.env"]


# --- the build ----------------------------------------------------------------------------------

def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics, enough for this file: last matching pattern wins, `!` re-includes."""
    verdict = False
    for pat in patterns:
        negate = pat.startswith("!")
        pat = pat.lstrip("!").strip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, "*/" + pat.removeprefix("**/"))
               for p in prefixes):
            verdict = not negate
    return verdict


def test_image_installs_the_project_from_its_own_files(dockerfile):
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.strip().startswith("#")]
    for secret in (".env", ".git", ".venv", "data/ethan.db", ".ethan-test"):
        assert _ignored(secret, patterns), f".dockerignore must keep {secret} out of the build context"
    copied: list[str] = []
    for i in dockerfile:
        if i.cmd == "COPY" and "--from" not in i.args:
            *sources, _dest = shlex.split(i.args)
            for src in sources:
                if any(ch in src for ch in "*?["):
                    continue      # optional by design (e.g. README*.md)
                assert (ROOT / src).exists(), f"COPY {src}: no such file in the repository"
                assert not _ignored(src, patterns), f"COPY {src}, but .dockerignore excludes it"
                copied.append(src)
    assert {"pyproject.toml", "bot", "memory"} <= set(copied)
    pyproject = (ROOT / "pyproject.toml").read_text()
    for package in re.findall(r'include\s*=\s*\[([^\]]*)\]', pyproject)[0].split(","):
        name = package.strip().strip('"').rstrip("*")
        assert name in copied, f"pyproject packages {name!r} but the image does not COPY it"
    runs = " ".join(i.args for i in dockerfile if i.cmd == "RUN")
    assert re.search(r"pip install \"?\.(\[postgres\])?\"?(\s|$)", runs), "install from pyproject.toml (`pip install .`)"
    assert "[postgres]" in runs, "compose.yaml's replicas run on PostgreSQL: the image needs the `postgres` extra"
    assert not re.search(r"\b(curl|wget)\b", runs), "no downloads besides the package index"
    # the runtime stage only copies the built virtualenv: nothing is installed at run time
    assert [i.args for i in final_stage(dockerfile) if i.cmd == "COPY"] == [
        "--from=build /opt/ethan/.venv /opt/ethan/.venv"]


def test_unit_file_passes_systemd_analyze(tmp_path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    ethan = Path(sys.executable).with_name("ethan")
    if not ethan.exists():
        pytest.skip("the ethan console script is not installed next to this python")
    unit = tmp_path / "ethan.service"
    unit.write_text(UNIT.read_text().replace("/opt/ethan/.venv/bin/ethan", str(ethan)))
    r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # verify exits 0 on unknown keys and bad values ("…, ignoring."): every complaint about our
    # file fails the test
    complaints = [ln for ln in (r.stdout + r.stderr).splitlines() if str(unit) in ln]
    assert r.returncode == 0 and not complaints, r.stdout + r.stderr


# --- the command and the health check, for real --------------------------------------------------

def _clean_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETHAN_", "LARK_", "ANTHROPIC_"))}
    # the code of this checkout, whatever the console script's install points at
    env.update(ETHAN_HOME=str(home), ETHAN_LOG_LEVEL="info", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")])), **extra)
    return env


def _ethan() -> str:
    path = Path(sys.executable).with_name("ethan")
    if not path.exists():
        pytest.skip("the ethan console script is not installed next to this python")
    return str(path)


def test_serve_answers_the_image_healthcheck_and_stops_on_sigterm(tmp_path, dockerfile):
    """`ethan serve` (the image's CMD) becomes healthy by the image's own HEALTHCHECK command,
    and on the image's STOPSIGNAL it shuts down in order and exits 0 within the grace period."""
    _, probe = healthcheck_command(one(final_stage(dockerfile), "HEALTHCHECK"))
    probe = [sys.executable, *probe[1:]]
    cmd = exec_form(one(final_stage(dockerfile), "CMD").args)
    proc = subprocess.Popen([_ethan(), *cmd[1:]], cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=_clean_env(tmp_path / "home", ETHAN_HOST="127.0.0.1", ETHAN_PORT="0"))
    lines: list[str] = []
    try:
        ready = None
        end = time.monotonic() + 60
        while ready is None and time.monotonic() < end:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            record = json.loads(line)          # JSON lines when not on a terminal
            if record["event"] == "app.ready":
                ready = record
        assert ready is not None, "".join(lines)
        port = ready["url"].rsplit(":", 1)[1]
        env = {**os.environ, "ETHAN_PORT": port}
        r = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=10)
        assert r.returncode == 0, r.stderr

        proc.send_signal(getattr(signal, one(final_stage(dockerfile), "STOPSIGNAL").args))
        _, rest = proc.communicate(timeout=shutdown_deadline_default() + SHUTDOWN_OVERHEAD_S)
        lines.extend(rest.splitlines(keepends=True))
        assert proc.returncode == 0, "".join(lines)
        events = [json.loads(ln)["event"] for ln in lines if ln.strip()]
        assert events.index("app.stopping") < events.index("app.stopped")
        assert (tmp_path / "home" / "ethan.db").exists()
        # nothing listens any more: the same probe now reports unhealthy
        r = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=10)
        assert r.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _post_chat(port: str, text: str) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}/chat", method="POST",
                                 data=json.dumps({"user_id": "ou_pipe", "text": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {"raw": e.read().decode(errors="replace")}


@pytest.mark.parametrize("how", ["make run, Ctrl-C", "container, SIGTERM"])
def test_serve_with_its_log_pipe_closed_answers_and_stops_cleanly(tmp_path, how):
    """(issue 52) `make run 2>&1 | tee log`, then tee exits: stdout and stderr are one pipe with
    no reader. Every log write used to raise BrokenPipeError into whatever logged — each
    POST /chat a 500; on SIGTERM the stop's first line raised, so the database was never closed,
    the main thread waited forever on the aiosqlite and checkpoint threads, and the forced exit
    died on its own log line. Now: lines are dropped and counted, answers are 200, SIGTERM
    closes the database (no -wal left, integrity ok) and exits 0 within the deadline.
    `make run` (stderr line-buffered, SIGINT from Ctrl-C) and the image (PYTHONUNBUFFERED=1,
    SIGTERM): buffered, the interpreter's last flush of the dead pipe made the exit status 120."""
    import sqlite3
    import urllib.request

    home = tmp_path / "home"
    env = _clean_env(home, ETHAN_HOST="127.0.0.1", ETHAN_PORT="0")
    sig = signal.SIGTERM
    if how.startswith("make run"):
        del env["PYTHONUNBUFFERED"]       # the Makefile's `ethan serve` runs without it
        sig = signal.SIGINT
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "bot", "serve"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=write_end, stderr=write_end, env=env)
    os.close(write_end)
    try:
        with os.fdopen(read_end) as logs:
            ready = None
            for line in logs:
                if json.loads(line)["event"] == "app.ready":
                    ready = json.loads(line)
                    break
        # the reader is gone: the next write to the pipe fails (EPIPE)
        assert ready is not None, "no app.ready"
        port = ready["url"].rsplit(":", 1)[1]
        answers = [_post_chat(port, f"hello {i}") for i in range(3)]
        assert [status for status, _ in answers] == [200, 200, 200], answers
        assert all("hello" in body["reply"] for _, body in answers), answers
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=10) as r:
            live = json.loads(r.read())
        assert live["state"] == "serving" and live["log_lines_dropped"] > 0, live

        t0 = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=shutdown_deadline_default() + SHUTDOWN_OVERHEAD_S)
        assert code == 0, f"exit status {code} after {time.monotonic() - t0:.1f} s"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    db = home / "ethan.db"
    assert db.exists() and not (home / "ethan.db-wal").exists(), sorted(p.name for p in home.iterdir())
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] >= 6   # 3 asked, 3 answered


def test_public_bind_without_console_token_stops_with_one_clear_line(tmp_path):
    """What a container started without ETHAN_CONSOLE_TOKEN in its .env does."""
    r = subprocess.run([_ethan(), "serve"], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                       env=_clean_env(tmp_path / "home", ETHAN_HOST="0.0.0.0", ETHAN_PORT="0"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "ethan: configuration error: ETHAN_CONSOLE_TOKEN is required when ETHAN_HOST is not a loopback address"]


# --- the operations guide ------------------------------------------------------------------------

def test_operations_guide_covers_the_manual_docker_check_and_sizing():
    text = OPERATIONS.read_text()
    assert "docker build -f deploy/Dockerfile" in text
    assert "docker compose -f deploy/compose.yaml" in text
    assert '"ready": true' in text and "/healthz" in text
    assert re.search(r"^#+ .*Sizing", text, re.M)
    assert "bench/README.md" in text


def test_operations_guide_names_every_log_event_and_metric():
    """Operators grep logs by event name and build dashboards on metric names: the guide must
    know every one the code emits."""
    text = OPERATIONS.read_text()
    emitted: set[str] = set()
    for path in (ROOT / "bot").rglob("*.py"):
        emitted |= set(re.findall(
            r"\b(?:log|bound|_log|self\._log)\.(?:debug|info|warning|error|exception)\(\s*\"([a-z_]+\.[a-z_.]+)\"",
            path.read_text()))
    assert len(emitted) > 20
    missing = sorted(e for e in emitted if f"`{e}`" not in text)
    assert not missing, f"docs/operations.md does not describe the log events {missing}"
    metrics = set(re.findall(r'(?:Counter|Gauge|Histogram)\(\s*"([a-z_]+)"', (ROOT / "bot" / "infra" / "metrics.py").read_text()))
    assert len(metrics) >= 8
    missing = sorted(m for m in metrics if m not in text)
    assert not missing, f"docs/operations.md does not describe the metrics {missing}"
