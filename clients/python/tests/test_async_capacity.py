"""The asyncio client under concurrency: many tasks wanting leases at once
never hold more than the fleet's capacity (3 crawl proxies x
``maxLeasesPerProxy`` 2), no proxy ever carries more than 2, each fetch
leaves from its proxy's own address, and every task gets its turn by
waiting out ``no_capacity``."""

from __future__ import annotations

import asyncio
import collections
from typing import Callable, Counter, List, Set

import httpx

from harness import CRAWLER_TOKEN, OUTGOING_NETWORK, Operator, Site, wait_for

from egress_proxies import AsyncLeaseClient, RetryPolicy

CRAWL = {"group": "crawl"}
TASKS = 18
HOLD = 0.3


def test_concurrent_tasks_never_exceed_capacity(operator: Operator, make_site: Callable[..., Site]) -> None:
    site = make_site()
    holding: Counter[str] = collections.Counter()
    peaks: List[int] = []
    per_proxy_peaks: Counter[str] = collections.Counter()
    peers: Set[str] = set()

    async def crawl(client: AsyncLeaseClient, i: int) -> None:
        async with client.lease(f"async-{i}.example", selector=CRAWL, ttl=30) as lease:
            holding[lease.proxy.name] += 1
            peaks.append(sum(holding.values()))
            per_proxy_peaks[lease.proxy.name] = max(per_proxy_peaks[lease.proxy.name], holding[lease.proxy.name])
            try:
                async with httpx.AsyncClient(proxy=lease.proxy.url, trust_env=False) as http:
                    answer = await http.get(f"{site.url}/whoami")
                assert answer.status_code == 200
                peers.add(answer.text)
                await asyncio.sleep(HOLD)
            finally:
                holding[lease.proxy.name] -= 1

    async def main() -> None:
        policy = RetryPolicy(max_wait=60, initial_backoff=0.05, max_backoff=0.5)
        async with AsyncLeaseClient(operator.url, CRAWLER_TOKEN, retry=policy) as client:
            await asyncio.wait_for(asyncio.gather(*(crawl(client, i) for i in range(TASKS))), timeout=90)

    asyncio.run(main())
    assert len(peaks) == TASKS, "every task got a lease"
    assert max(peaks) <= 6, peaks
    assert max(peaks) >= 4, f"the tasks did run side by side: {peaks}"
    assert all(peak <= 2 for peak in per_proxy_peaks.values()), per_proxy_peaks
    prefix = OUTGOING_NETWORK.rsplit(".", 1)[0] + "."
    assert len(peers) == 3 and all(p.startswith(prefix) for p in peers), peers
    wait_for("no lease held", 5, lambda: not any(operator.active_leases().values()))
