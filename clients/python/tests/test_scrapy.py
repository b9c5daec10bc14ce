"""A real Scrapy crawl through leased proxies: the site blocks the first
proxy to fetch a page (by its outgoing address); the middleware reports it
``blocked``, takes another proxy and the crawl completes; at the end no
lease is held and the blocked proxy rests for the site. The error path
(a proxy that cannot be reached) drives the middleware with real Scrapy
requests against the real operator."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List

import httpx
import pytest
from twisted.internet.error import ConnectionRefusedError

from harness import CRAWLER_TOKEN, Operator, Site, wait_for

from egress_proxies import LeaseClient, NoCapacity, RetryPolicy

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
CRAWL = {"group": "crawl"}


def run_spider(site: Site, operator: Operator, out: Path, *settings: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "scrapy", "runspider", str(HERE / "spiders" / "site_spider.py"),
        "-a", f"start={site.url}/", "-a", f"stats_file={out / 'stats.json'}",
        "-O", str(out / "items.jsonl"),
        "-s", 'DOWNLOADER_MIDDLEWARES={"egress_proxies.scrapy.LeaseMiddleware": 610}',
        "-s", f"EGRESS_PROXIES_URL={operator.url}",
        "-s", 'EGRESS_PROXIES_SELECTOR={"group": "crawl"}',
        "-s", "ROBOTSTXT_OBEY=False",
        "-s", "TELNETCONSOLE_ENABLED=False",  # no listening ports but the site's
        "-s", "REMOTE_CONTROL_ENABLED=False",
        "-s", "LOG_LEVEL=INFO",
        *settings,
    ]  # fmt: skip
    env = dict(os.environ, DISCOVERY_TOKEN=CRAWLER_TOKEN, PYTHONPATH=str(SRC))
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, cwd=out)


def test_a_crawl_moves_off_a_blocked_proxy_and_releases_everything(
    operator: Operator, make_site: Callable[..., Site], tmp_path: Path
) -> None:
    site = make_site(pages=12, block_first_peer=True)
    done = run_spider(
        site, operator, tmp_path,
        "-s", "EGRESS_PROXIES_TTL=2",  # short: the crawl outlives half of it, so leases are renewed
        "-s", "DOWNLOAD_DELAY=0.2",
        "-s", "CONCURRENT_REQUESTS=4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "egress_proxies" not in "".join(l for l in done.stderr.splitlines() if "Warning" in l), done.stderr[-4000:]
    items = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    stats = json.loads((tmp_path / "stats.json").read_text())
    log = done.stderr[-4000:]

    assert sorted(int(i["heading"]) for i in items) == list(range(1, 13)), log
    assert all(i["status"] == 200 for i in items)
    assert len(site.blocked) == 1
    (blocked_peer,) = site.blocked
    refused = [h for h in site.hits if h.status == 403]
    served = [h for h in site.hits if h.status == 200 and h.path.startswith("/page/")]
    assert refused and all(h.peer == blocked_peer for h in refused)
    assert {h.path for h in served} == {f"/page/{i}" for i in range(1, 13)}
    assert blocked_peer not in {h.peer for h in served}, "no page was served to the blocked proxy"
    assert stats.get("egress_proxies/blocked") == 1, stats
    assert stats.get("egress_proxies/acquired", 0) >= 2, stats
    assert stats.get("egress_proxies/renewed", 0) >= 1, stats

    # Every lease is back.
    wait_for("no lease held", 5, lambda: not any(operator.active_leases().values()))
    # The report reached the operator: after the release's one-second rest,
    # the site's leases go to the other two proxies only (2 leases each),
    # and none of them leaves from the blocked address.
    time.sleep(1.2)
    with LeaseClient(operator.url, CRAWLER_TOKEN, retry=RetryPolicy(max_wait=0)) as client:
        taken = [client.acquire(site.host, selector=CRAWL) for _ in range(4)]
        try:
            with pytest.raises(NoCapacity):
                client.acquire(site.host, selector=CRAWL)
            peers = set()
            for lease in taken:
                with httpx.Client(proxy=lease.proxy.url, trust_env=False) as http:
                    answer = http.get(f"{site.url}/whoami")
                assert answer.status_code == 200
                peers.add(answer.text)
            assert len(peers) == 2 and blocked_peer not in peers, peers
        finally:
            for lease in taken:
                client.release(lease)


def test_a_proxy_scrapy_cannot_reach_is_reported_error(operator: Operator) -> None:
    from scrapy import Request
    from scrapy.utils.test import get_crawler

    from egress_proxies.scrapy import META_LEASE, LeaseMiddleware

    class Spider:
        name = "errors"

    crawler = get_crawler(
        settings_dict={
            "EGRESS_PROXIES_URL": operator.url,
            "EGRESS_PROXIES_TOKEN": CRAWLER_TOKEN,
            "EGRESS_PROXIES_SELECTOR": {"group": "spare-2"},
            "EGRESS_PROXIES_ACQUIRE_TIMEOUT": 0,
        }
    )

    async def scenario() -> List[str]:
        middleware = LeaseMiddleware(crawler)
        request = Request("http://unreachable.example/page")
        assert await middleware.process_request(request) is None
        lease = request.meta[META_LEASE]
        assert lease.proxy.name == "spare-2"
        assert request.meta["proxy"] == lease.proxy.url
        # Scrapy could not connect to the proxy.
        assert await middleware.process_exception(request, ConnectionRefusedError("refused")) is None
        # `error` rests the proxy for every target: nothing is left for another host.
        events = []
        try:
            await middleware.process_request(Request("http://other.example/"))
        except NoCapacity:
            events.append("no capacity elsewhere")
        await middleware.spider_closed(Spider())  # type: ignore[arg-type]
        return events

    assert asyncio.run(scenario()) == ["no capacity elsewhere"]
    assert operator.active_leases()["spare-2"] == 0


def test_without_the_asyncio_reactor_the_crawl_does_not_start(
    operator: Operator, make_site: Callable[..., Site], tmp_path: Path
) -> None:
    site = make_site()
    done = run_spider(site, operator, tmp_path, "-s", "TWISTED_REACTOR=twisted.internet.epollreactor.EPollReactor")
    assert "needs the asyncio reactor" in done.stderr, done.stderr[-4000:]
    assert not site.hits, "nothing was fetched without a proxy"
