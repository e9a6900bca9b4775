"""Issue 17, Medium 1 and the login lockout: the console behind a reverse proxy.

A proxy on the same machine (nginx's default ``proxy_pass``) connects from 127.0.0.1 and
forwards ``Host: 127.0.0.1:PORT``. Once ``ETHAN_CONSOLE_TOKEN`` is set, every request but
``/lark/events`` and ``/healthz`` needs it whatever the Host says; forwarding headers are
believed only from ``ETHAN_TRUSTED_PROXIES``; ten wrong logins through the proxy never lock the
operator out.
"""

from __future__ import annotations

from tests.harness import Harness

TOKEN = "console-token-7c1e"
PROTECTED = [("GET", "/api/users"), ("GET", "/api/users/ou_alice/facts"), ("GET", "/api/sessions"),
             ("GET", "/metrics"), ("POST", "/chat"), ("GET", "/api/users/ou_alice/episodes"),
             ("POST", "/no/such/route")]     # a route added later is covered before it exists


async def _call(h, method, path, headers=None, **kw):
    async with h.http.request(method, h.url + path, headers=headers or {}, allow_redirects=False, **kw) as r:
        return r.status, r.headers.get("Location", ""), await r.text()


async def test_with_a_token_every_request_needs_it_even_under_a_loopback_host(tmp_path):
    async with Harness(tmp_path, ethan_console_token=TOKEN) as h:
        await h.send_text("记住我喜欢喝咖啡", sender="ou_alice")
        await h.replies(1)
        proxy = {"Host": f"127.0.0.1:{h.app.port}", "X-Forwarded-For": "203.0.113.50"}
        for headers in ({}, proxy, {"Host": "localhost"}, {**proxy, "Authorization": "Bearer wrong"}):
            for method, path in PROTECTED:
                status, _, body = await _call(h, method, path, headers)
                assert status == 401, (method, path, headers, status, body[:200])
                assert "ou_alice" not in body
            status, location, _ = await _call(h, "GET", "/users/ou_alice/facts", headers)
            assert status == 303 and location.startswith("/login"), (status, location)
        auth = {**proxy, "Authorization": f"Bearer {TOKEN}"}
        status, _, body = await _call(h, "GET", "/api/users", auth)
        assert status == 200 and "ou_alice" in body
        assert (await _call(h, "GET", "/metrics", auth))[0] == 200
        # Open: health for probes, the webhook (Lark signs it), the login page and its files.
        assert (await _call(h, "GET", "/healthz", proxy))[0] == 200
        assert (await _call(h, "GET", "/login", proxy))[0] == 200
        assert (await _call(h, "GET", "/static/console.css", proxy))[0] == 200
        await h.send_text("还在吗", sender="ou_alice")
        await h.replies(2)


async def test_no_token_console_is_closed_to_a_proxy_we_do_not_trust(tmp_path):
    """No token, loopback bind: open to the operator's own browser only. A request that a
    proxy forwarded (its headers say so) is not local, whatever Host it carries."""
    async with Harness(tmp_path) as h:
        assert (await _call(h, "GET", "/api/users"))[0] == 200
        for fwd in ({"X-Forwarded-For": "203.0.113.50"}, {"Forwarded": "for=203.0.113.50"},
                    {"X-Forwarded-For": "127.0.0.1"}):          # spoofed "local": not believed
            status, _, body = await _call(h, "GET", "/api/users", {"Host": f"127.0.0.1:{h.app.port}", **fwd})
            assert status == 403, (fwd, status, body[:200])
            assert (await _call(h, "GET", "/metrics", fwd))[0] == 403


async def test_a_trusted_proxy_names_the_client(tmp_path):
    async with Harness(tmp_path, ethan_trusted_proxies=["127.0.0.1/32", "10.0.0.0/8"]) as h:
        # The proxy says the client is remote: the no-token console is not theirs.
        for fwd in ({"X-Forwarded-For": "203.0.113.50"}, {"Forwarded": 'for="[2001:db8::7]:4711"'},
                    {"X-Forwarded-For": "203.0.113.50, 10.1.2.3"}):   # right-most untrusted hop counts
            assert (await _call(h, "GET", "/api/users", fwd))[0] == 403, fwd
        # ... and a client on the proxy's own machine is local.
        assert (await _call(h, "GET", "/api/users", {"X-Forwarded-For": "127.0.0.1"}))[0] == 200
        # A forged left-most entry does not help: the proxy appends the real peer on the right.
        assert (await _call(h, "GET", "/api/users", {"X-Forwarded-For": "127.0.0.1, 203.0.113.50"}))[0] == 403


async def test_wrong_logins_through_a_proxy_never_lock_the_operator_out(tmp_path, logs):
    async with Harness(tmp_path, ethan_console_token=TOKEN, ethan_trusted_proxies=["127.0.0.1"]) as h:
        mallory = {"X-Forwarded-For": "203.0.113.66"}
        for _ in range(10):
            assert (await _call(h, "POST", "/login", mallory, data={"token": "guess"}))[0] == 401
        assert (await _call(h, "POST", "/login", mallory, data={"token": "guess"}))[0] == 429
        # Throttling is keyed on the client the trusted proxy names: the operator's address is not throttled.
        operator = {"X-Forwarded-For": "198.51.100.7"}
        assert (await _call(h, "POST", "/login", operator, data={"token": "typo"}))[0] == 401
        # And a correct token is accepted even from the throttled address.
        status, location, _ = await _call(h, "POST", "/login", mallory, data={"token": TOKEN})
        assert status == 303 and location == "/"
        throttled = logs.events("console.login_throttled")
        assert throttled and {e["client"] for e in throttled} == {"203.0.113.66"}


async def test_untrusted_forwarding_headers_do_not_choose_the_throttle_key(tmp_path, logs):
    """Without ETHAN_TRUSTED_PROXIES an attacker cannot spread guesses over invented addresses."""
    async with Harness(tmp_path, ethan_console_token=TOKEN) as h:
        for i in range(10):
            fwd = {"X-Forwarded-For": f"203.0.113.{i}"}
            assert (await _call(h, "POST", "/login", fwd, data={"token": "guess"}))[0] == 401
        assert (await _call(h, "POST", "/login", {"X-Forwarded-For": "198.51.100.1"},
                            data={"token": "guess"}))[0] == 429
        assert (await _call(h, "POST", "/login", data={"token": TOKEN}))[0] == 303
        assert {e["client"] for e in logs.events("console.login_failed")} == {"127.0.0.1"}
