"""The private lark-oapi API bot/lark/transport/compat.py wraps still has the shape the long connection
relies on (issue 28: "a test that fails on an incompatible SDK release"), on the lark-oapi
installed — and that version is inside the range this was tested on, pyproject.toml's pin.

If this fails after an upgrade: read lark_oapi/ws/client.py for the member named in the
failure, adapt bot/lark/transport/compat.py (the only module that touches them), then widen
``compat.TESTED`` and the pin in pyproject.toml together. The wire behaviour itself is
tests/e2e/test_long_connection.py's (the real client against tests/fakes/fake_lark_ws.py).
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import re
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from bot.lark.transport import compat

ROOT = Path(__file__).resolve().parents[2]

# name -> the parameter names after ``self`` (the calls compat.py makes)
METHOD_PARAMS = {
    "_get_conn_url": [],
    "_handle_message": ["msg"],
    "_handle_control_frame": ["frame"],
    "_handle_data_frame": ["frame"],
    "_write_message": ["data"],
    "_combine": ["msg_id", "sum_", "seq", "bs"],
    "_configure": ["conf"],
}
COROUTINES = {"_handle_message", "_handle_control_frame", "_handle_data_frame", "_write_message"}
MODULE_PARAMS = {
    "_get_by_key": ["headers", "key"],
    "_new_ping_frame": ["service_id"],
    "_ws_connect_kwargs": ["connection_headers"],
    "_parse_ws_conn_exception": ["e"],
    "build_connection_url": None,      # public, re-exported by the module: two positionals
}


def pinned() -> SpecifierSet:
    text = (ROOT / "pyproject.toml").read_text()
    [line] = re.findall(r'^\s*"(lark-oapi[^"]*)"', text, re.M)
    return Requirement(line).specifier


def test_the_pin_is_the_tested_range_and_the_installed_version_is_in_it():
    spec = pinned()
    assert spec == SpecifierSet(compat.TESTED), (
        f"pyproject.toml pins lark-oapi {spec}, but bot/lark/transport/compat.py was tested on {compat.TESTED}: "
        "run this file on the new range, then change both together")
    assert any(s.operator in ("<", "<=", "==", "~=") for s in spec), "the pin needs an upper bound"
    assert version("lark-oapi") in spec, f"lark-oapi {version('lark-oapi')} is installed, outside {spec}"


def test_the_lists_in_compat_name_every_private_member_it_uses():
    """The lists the checks below walk are complete: every ``self._x`` / ``sdk._x`` in
    compat.py is in them (a new private use cannot slip past this test)."""
    source = (ROOT / "bot/lark/transport/compat.py").read_text()
    used_self = set(re.findall(r"self\.(_[a-z][a-z_]*)", source))
    used_sdk = set(re.findall(r"sdk\.(_[a-z][a-z_]*)", source))
    assert used_self <= set(compat.CLIENT_PRIVATE_METHODS) | set(compat.CLIENT_PRIVATE_ATTRS), \
        used_self - set(compat.CLIENT_PRIVATE_METHODS) - set(compat.CLIENT_PRIVATE_ATTRS)
    assert used_sdk <= set(compat.MODULE_PRIVATES), used_sdk - set(compat.MODULE_PRIVATES)
    assert set(METHOD_PARAMS) == set(compat.CLIENT_PRIVATE_METHODS)
    assert set(MODULE_PARAMS) - {"build_connection_url"} == set(compat.MODULE_PRIVATES)


def test_private_methods_have_the_expected_signatures():
    from lark_oapi.ws import client as sdk

    for name, params in METHOD_PARAMS.items():
        fn = getattr(sdk.Client, name, None)
        assert fn is not None, f"lark_oapi.ws.Client.{name} is gone"
        got = [p.name for p in inspect.signature(fn).parameters.values()][1:]
        assert len(got) == len(params), f"Client.{name}{tuple(got)}: expected {tuple(params)}"
        assert inspect.iscoroutinefunction(fn) == (name in COROUTINES), \
            f"Client.{name} is {'no longer' if name in COROUTINES else 'now'} a coroutine function"
    for name, params in MODULE_PARAMS.items():
        fn = getattr(sdk, name, None)
        assert callable(fn), f"lark_oapi.ws.client.{name} is gone"
        got = list(inspect.signature(fn).parameters)
        assert len(got) == (2 if params is None else len(params)), f"{name}{tuple(got)}"
    ctor = list(inspect.signature(sdk.Client.__init__).parameters)
    for kw in ("app_id", "app_secret", "log_level", "event_handler", "domain", "auto_reconnect"):
        assert kw in ctor, f"Client.__init__ lost {kw}"


def test_private_attributes_exist_on_a_fresh_client_with_the_expected_types():
    from lark_oapi.ws import client as sdk

    async def make():
        # Constructed on a running loop, as compat's session is (the SDK's lock and cache).
        session = compat.session_class()("cli_x", "secret", "http://127.0.0.1:9",
                                         on_frame=None, on_ack_lost=None)
        return session

    session = asyncio.run(make())
    assert isinstance(session, sdk.Client)
    for name in compat.CLIENT_PRIVATE_ATTRS:
        assert hasattr(session, name), f"lark_oapi.ws.Client() has no {name} any more"
    for name in ("_reconnect_nonce", "_reconnect_count", "_reconnect_interval", "_ping_interval"):
        assert isinstance(getattr(session, name), int), f"{name} is {getattr(session, name)!r}"
    assert session._conn is None and session._conn_id == "" and session._service_id == ""
    assert session._domain == "http://127.0.0.1:9"
    assert isinstance(session._lock, asyncio.Lock)
    assert callable(getattr(session._cache, "get", None)) and callable(getattr(session._cache, "set", None))
    assert isinstance(getattr(session._cache, "_cron", None), asyncio.Task), "ExpiringCache._cron (closed by close())"


def test_the_wrapped_privates_behave_as_compat_expects():
    """Behaviour, not only names: fragments reassemble, a pong's ClientConfig is applied, a
    ping frame is a CONTROL ``type=ping`` for the service, the response frame's data is
    base64 of the card JSON (as lark-oapi writes it)."""
    from lark_oapi.core.json import JSON
    from lark_oapi.ws.model import Response
    from lark_oapi.ws.pb.pbbp2_pb2 import Frame

    async def run():
        s = compat.session_class()("cli_x", "secret", "http://127.0.0.1:9", on_frame=None, on_ack_lost=None)
        assert s._combine("m1", 2, 0, b"ab") is None
        assert s._combine("m1", 2, 1, b"cd") == b"abcd"
        pong = Frame()
        pong.SeqID, pong.LogID, pong.service, pong.method = 0, 0, 7, 0
        h = pong.headers.add()
        h.key, h.value = "type", "pong"
        pong.payload = json.dumps({"ReconnectCount": 3, "ReconnectInterval": 4, "ReconnectNonce": 5,
                                   "PingInterval": 6}).encode()
        await s.handle(pong.SerializeToString())
        assert (s.reconnect_count, s.reconnect_interval, s.reconnect_nonce, s.ping_interval) == (3, 4, 5, 6)
        s._service_id = "7"
        ping = Frame()
        ping.ParseFromString(s.ping())
        assert ping.method == 0 and ping.service == 7
        assert {x.key: x.value for x in ping.headers} == {"type": "ping"}

    asyncio.run(run())
    payload = json.loads(compat.response_payload(200, {"toast": {"type": "info", "content": "hi"}}, JSON, Response))
    assert payload["code"] == 200
    assert json.loads(base64.b64decode(payload["data"])) == {"toast": {"type": "info", "content": "hi"}}
    assert "data" not in json.loads(compat.response_payload(500, None, JSON, Response))


def test_the_handshake_error_parser_still_raises_the_sdks_exceptions():
    from lark_oapi.ws import client as sdk

    class Refusal(Exception):
        headers = {"handshake-status": "403", "handshake-msg": "forbidden"}

    with pytest.raises(compat.sdk_client_exception()):
        sdk._parse_ws_conn_exception(Refusal())
