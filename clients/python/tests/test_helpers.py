"""The requests session and the httpx transports: every host through a
leased proxy (the site sees a proxy's outgoing address), a block — here a
body marker — reported and the request sent again through another proxy,
every lease released on close."""

from __future__ import annotations

import asyncio
from typing import Callable

import httpx

from harness import CRAWLER_TOKEN, OUTGOING_NETWORK, Operator, Site, wait_for

from egress_proxies import AsyncLeaseClient, BlockRules, LeaseClient
from egress_proxies.httpx import AsyncLeasedTransport, LeasedTransport
from egress_proxies.requests import LeasedSession

CRAWL = {"group": "crawl"}
PREFIX = OUTGOING_NETWORK.rsplit(".", 1)[0] + "."


def captcha_for_first_peer(site: Site) -> None:
    """The site answers the first peer's page requests with a captcha page (200)."""
    original = site.answer

    def answer(peer: str, path: str) -> tuple[int, str]:
        if path.startswith("/page/"):
            if not site.blocked:
                site.blocked.add(peer)
            if peer in site.blocked:
                return 200, "<html><body>Please solve this CAPTCHA</body></html>"
        return original(peer, path)

    site.answer = answer  # type: ignore[method-assign]


def no_lease_held(operator: Operator) -> None:
    wait_for("no lease held", 5, lambda: not any(operator.active_leases().values()))


def test_requests_session(operator: Operator, make_site: Callable[..., Site]) -> None:
    site = make_site()
    captcha_for_first_peer(site)
    client = LeaseClient(operator.url, CRAWLER_TOKEN)
    with LeasedSession(client, selector=CRAWL, block_rules=BlockRules.of(markers=["captcha"])) as session:
        whoami = session.get(f"{site.url}/whoami")
        assert whoami.status_code == 200 and whoami.text.startswith(PREFIX)
        page = session.get(f"{site.url}/page/1")
        assert page.status_code == 200 and "<h1>1</h1>" in page.text
        assert operator.active_leases() != {} and sum(operator.active_leases().values()) == 1
    client.close()
    (blocked,) = site.blocked
    assert blocked == whoami.text, "the first proxy was the one blocked"
    assert [h.peer for h in site.hits if h.path == "/page/1" and h.peer != blocked], "served via another proxy"
    no_lease_held(operator)


def test_httpx_transport(operator: Operator, make_site: Callable[..., Site]) -> None:
    site = make_site()
    captcha_for_first_peer(site)
    transport = LeasedTransport(
        LeaseClient(operator.url, CRAWLER_TOKEN), selector=CRAWL, block_rules=BlockRules.of(markers=["captcha"])
    )
    with httpx.Client(transport=transport) as http:
        first = http.get(f"{site.url}/whoami").text
        page = http.get(f"{site.url}/page/2")
        assert page.status_code == 200 and "<h1>2</h1>" in page.text
        assert http.get(f"{site.url}/whoami").text not in (first, ""), "now through another proxy"
    transport.lease_client.close()
    assert site.blocked == {first}
    no_lease_held(operator)


def test_async_httpx_transport(operator: Operator, make_site: Callable[..., Site]) -> None:
    sites = [make_site(), make_site()]

    async def main() -> set[str]:
        transport = AsyncLeasedTransport(AsyncLeaseClient(operator.url, CRAWLER_TOKEN), selector=CRAWL)
        async with httpx.AsyncClient(transport=transport) as http:
            answers = await asyncio.gather(*(http.get(f"{s.url}/whoami") for s in sites for _ in range(3)))
            assert all(a.status_code == 200 for a in answers)
            assert sum(operator.active_leases().values()) == 2, "one lease per host"
        await transport.lease_client.aclose()
        return {a.text for a in answers}

    peers = asyncio.run(main())
    assert peers and all(p.startswith(PREFIX) for p in peers)
    no_lease_held(operator)
