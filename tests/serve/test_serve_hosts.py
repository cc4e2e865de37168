"""The ``Host`` a request names: the loopback, the address it reached and ``--allowed-hosts``
are served; any other name is a 400 before routing (DNS rebinding, the trailing-slash
redirect), as Starlette's TrustedHostMiddleware refuses it."""

from __future__ import annotations

import pytest
from _serve_helpers import live_server

from qkv._errors import SettingError
from qkv.serve import ServeConfig


def refused(r, host: str) -> None:
    assert r.status_code == 400, (host, r.status_code, r.text)
    said = r.json()["error"]
    assert said.startswith("Host: ") and "--allowed-hosts" in said, said
    assert "location" not in r.headers


def test_only_the_names_it_answers_to(live):
    port = live.url.rsplit(":", 1)[1]
    for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", "[::1]:8000", "LocalHost."):
        assert live.get("/health", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.2", "localhost.evil.example"):
        refused(live.get("/health", headers={"Host": host}), host)
        refused(live.post("/translate", json={"q": "go ."}, headers={"Host": host}), host)
    # the trailing-slash redirect pointed at whatever host the client named
    r = live.get("/health/", headers={"Host": "evil.example"}, follow_redirects=False)
    refused(r, "evil.example")
    r = live.get("/health/", headers={"Host": f"localhost:{port}"}, follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == f"http://localhost:{port}/health"


def test_allowed_hosts_widen_it(translator):
    allowed = ("translate.example.org", "*.corp.example")
    with live_server(translator, allowed_hosts=allowed) as s:
        for host in ("translate.example.org", "TRANSLATE.example.org:80", "a.corp.example"):
            assert s.get("/health", headers={"Host": host}).status_code == 200, host
        assert s.get("/health", headers={"Host": "localhost"}).status_code == 200
        for host in ("corp.example", "example.org", "a.translate.example.org"):
            refused(s.get("/health", headers={"Host": host}), host)
    with live_server(translator, allowed_hosts=["*"]) as s:
        assert s.get("/health", headers={"Host": "anything.example"}).status_code == 200


@pytest.mark.parametrize("bad", ["a.example:8000", "http://a.example", "a/b", "", "é.fr"])
def test_allowed_hosts_are_names(bad):
    with pytest.raises(SettingError, match=r"^allowed_hosts: expected a host name"):
        ServeConfig(allowed_hosts=(bad,))
    with pytest.raises(SettingError, match=r"^allowed_hosts: expected a list"):
        ServeConfig(allowed_hosts="a.example")  # type: ignore[arg-type]


def test_the_address_a_request_reached_is_allowed(translator):
    """On a server listening on every address, a client on the network names the address it
    typed; a dual-stack socket reports IPv4 ones as ::ffff:a.b.c.d."""
    import asyncio

    import httpx

    from qkv.serve import create_app

    app = create_app(translator, ServeConfig("en", "fr"))

    async def ask(server: tuple[str, int], host: str) -> int:
        async def reached(scope, receive, send):  # as uvicorn says where a request arrived
            await app({**scope, "server": server}, receive, send)

        transport = httpx.ASGITransport(app=reached)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            r = await client.get("/openapi.json", headers={"Host": host})
            return r.status_code

    async def main() -> list[int]:
        return [
            await ask(("192.168.1.20", 8000), "192.168.1.20:8000"),
            await ask(("::ffff:192.168.1.20", 8000), "192.168.1.20:8000"),
            await ask(("fe80::1", 8000), "[fe80::1]:8000"),
            await ask(("192.168.1.20", 8000), "192.168.1.21:8000"),
        ]

    assert asyncio.run(main()) == [200, 200, 200, 400]
