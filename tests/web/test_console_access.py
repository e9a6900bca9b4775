"""Who may use the console: open on loopback, token elsewhere; no cross-site writes."""

from __future__ import annotations

import re

import aiohttp
import pytest

from bot.app import EthanApp
from bot.infra.config import ConfigError, load_settings
from tests.web.conftest import offline_settings

TOKEN = "s3cret-console-token"
PLAY = {"user_id": "ou_alice", "name": "Alice", "text": "记住我喜欢喝咖啡"}


@pytest.fixture
async def remote(tmp_path):
    """Bound to every interface (not loopback): the token is required."""
    app = EthanApp(offline_settings(tmp_path, ethan_host="0.0.0.0", ethan_console_token=TOKEN))
    await app.start()
    # cookies for 127.0.0.1 are kept (unsafe=True: an IP address host)
    http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    try:
        yield app, http
    finally:
        await http.close()
        await app.stop()


def bearer(token: str = TOKEN) -> dict:
    return {"Authorization": f"Bearer {token}"}


async def test_non_loopback_api_needs_the_token(remote):
    app, http = remote
    url = app.base_url
    for path in ("/api/users", "/api/users/ou_alice/facts", "/api/sessions"):
        async with http.get(url + path) as r:
            assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
        async with http.get(url + path, headers=bearer("wrong-token")) as r:
            assert r.status == 401
        async with http.get(url + path, headers=bearer()) as r:
            assert r.status == 200
    async with http.post(url + "/api/playground", json=PLAY) as r:
        assert r.status == 401
    async with http.delete(url + "/api/users/ou_alice/facts/1") as r:
        assert r.status == 401
    # with the token the whole pipeline works, offline model included (not behind the console's auth)
    async with http.post(url + "/api/playground", json=PLAY, headers=bearer()) as r:
        body = await r.json()
        assert r.status == 200 and body["text"].startswith("[offline] ")
    async with http.get(url + "/healthz") as r:
        assert r.status == 200                      # health stays open for probes
    async with http.get(url + "/livez") as r:       # the image's HEALTHCHECK sends no token (issue 52)
        assert r.status == 200 and (await r.json())["status"] == "alive"


async def test_pages_redirect_to_login_and_the_cookie_works(remote):
    app, http = remote
    url = app.base_url
    async with http.get(url + "/users/ou_alice/facts", allow_redirects=False) as r:
        assert r.status == 303 and r.headers["Location"] == "/login?next=/users/ou_alice/facts"
    async with http.get(url + "/login") as r:
        assert r.status == 200 and 'name="token"' in await r.text()
    async with http.post(url + "/login", data={"token": "nope", "next": "/users"}, allow_redirects=False) as r:
        assert r.status == 401 and "not right" in await r.text()
    assert not http.cookie_jar.filter_cookies(url)
    async with http.post(url + "/login", data={"token": TOKEN, "next": "//evil.example/x"},
                         allow_redirects=False) as r:
        assert r.status == 303 and r.headers["Location"] == "/"      # never off-site
        cookie = r.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
        assert TOKEN not in cookie
    async with http.get(url + "/users/ou_alice/facts") as r:
        assert r.status == 200 and "Sign out" in await r.text()
    async with http.get(url + "/api/users") as r:
        assert r.status == 200
    # a write with the cookie from the console's own origin is fine ...
    origin = {"Origin": url}
    async with http.post(url + "/api/users/ou_alice/facts", json={"content": "Alice 喜欢猫"}, headers=origin) as r:
        assert r.status == 201
    # ... from another site it is refused even though the browser would send the cookie
    async with http.post(url + "/api/users/ou_alice/facts", json={"content": "x"},
                         headers={"Origin": "http://evil.example"}) as r:
        assert r.status == 403
    async with http.post(url + "/logout", headers=origin, allow_redirects=False) as r:
        assert r.status == 303
    async with http.get(url + "/api/users") as r:
        assert r.status == 401


async def test_login_is_throttled_but_the_right_token_still_works(remote):
    """Wrong guesses past ten are answered 429 (after a delay); the operator's correct token is
    accepted all the same — behind a proxy everyone shares one address (issue 17)."""
    app, http = remote
    for _ in range(10):
        async with http.post(app.base_url + "/login", data={"token": "guess"}) as r:
            assert r.status == 401
    async with http.post(app.base_url + "/login", data={"token": "guess"}) as r:
        assert r.status == 429
    async with http.post(app.base_url + "/login", data={"token": TOKEN}, allow_redirects=False) as r:
        assert r.status == 303


@pytest.mark.parametrize("headers, status", [
    ({"Origin": "http://evil.example"}, 403),
    ({"Origin": "null"}, 403),
    ({"Referer": "http://evil.example/page"}, 403),
    ({"Sec-Fetch-Site": "cross-site"}, 403),
    ({"Sec-Fetch-Site": "same-site", "Origin": "http://sub.evil.example"}, 403),
    ({}, 201),                                     # not a browser (curl, scripts)
])
async def test_cross_site_writes_refused_even_on_loopback(console, headers, status):
    async with console.http.post(console.url + "/api/users/ou_alice/facts",
                                 json={"content": "Alice 喜欢猫", "category": "preference"}, headers=headers) as r:
        assert r.status == status, await r.text()
    async with console.http.get(console.url + "/api/users/ou_alice/facts") as r:
        facts = (await r.json())["facts"]
    assert len(facts) == (1 if status == 201 else 0)


async def test_same_origin_writes_and_json_only(console):
    url = console.url
    async with console.http.post(url + "/api/users/ou_alice/facts", json={"content": "Alice 喜欢猫"},
                                 headers={"Origin": url, "Sec-Fetch-Site": "same-origin"}) as r:
        assert r.status == 201
    # a form-encoded or text/plain body (what a cross-site form can send) is not accepted by the API
    for ctype in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"):
        async with console.http.post(url + "/api/playground", data=b'{"user_id":"ou_a","text":"hi"}',
                                     headers={"Content-Type": ctype}) as r:
            assert r.status == 415, ctype
    async with console.http.post(url + "/logout", headers={"Origin": "http://evil.example"}) as r:
        assert r.status == 403


async def test_loopback_bind_is_open_only_under_a_loopback_host_name(console):
    url = console.url
    async with console.http.get(url + "/api/users") as r:
        assert r.status == 200
    async with console.http.get(url + "/api/users", headers={"Host": "localhost:1234"}) as r:
        assert r.status == 200
    # DNS rebinding: evil.example resolving to 127.0.0.1 — the browser sends Host: evil.example
    async with console.http.get(url + "/api/users", headers={"Host": "evil.example"}) as r:
        assert r.status == 403
    async with console.http.get(url + "/users", headers={"Host": "evil.example"}) as r:
        assert r.status == 403


async def test_loopback_bind_with_a_token_accepts_it_under_other_names(tmp_path):
    app = EthanApp(offline_settings(tmp_path, ethan_console_token=TOKEN))
    await app.start()
    try:
        async with aiohttp.ClientSession() as http:
            h = {"Host": "bot.example.com"}
            async with http.get(app.base_url + "/api/users", headers=h) as r:
                assert r.status == 401
            async with http.get(app.base_url + "/api/users", headers={**h, **bearer()}) as r:
                assert r.status == 200
    finally:
        await app.stop()


async def test_security_headers(console):
    async with console.http.get(console.url + "/users") as r:
        csp = r.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert r.headers["X-Frame-Options"] == "DENY" and r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["Cache-Control"] == "no-store"
        html = await r.text()
    # no inline script or handler anywhere: the CSP would block it anyway
    assert not re.search(r"<script(?![^>]*\bsrc=)", html) and " onclick=" not in html
    async with console.http.get(console.url + "/api/users") as r:
        assert r.headers["Cache-Control"] == "no-store" and "Content-Security-Policy" in r.headers


def test_config_refuses_a_non_loopback_bind_without_a_token(tmp_path):
    with pytest.raises(ConfigError, match="ETHAN_CONSOLE_TOKEN"):
        load_settings(_env_file=None, ethan_home=tmp_path, ethan_host="0.0.0.0", ethan_console_token="")
