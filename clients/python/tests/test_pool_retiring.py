"""Leases on a ProxyPool whose member is replaced: renewing on the retiring
member answers ``ProxyRetiring``, and ``HostLeases`` hands the lease back and
moves the host to the successor — against the real operator."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator, List

import pytest

from harness import CRAWLER_TOKEN, Operator, PoolSpec, wait_for

from egress_proxies import HostLeases, LeaseClient, LeaseTerms, ProxyRetiring


@pytest.fixture
def aging_pool(tmp_path: Path, operator_binary: str) -> Iterator[Operator]:
    # One member, replaced every 8 s: its successor is Ready before it retires.
    pool = PoolSpec("eu", 1, "  rotation: {maxAge: 8s}\n  drainTimeout: 1m\n")
    operator = Operator(operator_binary, tmp_path, [], pools=[pool], max_leases_per_proxy=1)
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()


def test_a_retiring_member_refuses_renewal_and_host_leases_move_on(aging_pool: Operator) -> None:
    events: List[str] = []
    with LeaseClient(aging_pool.url, token=CRAWLER_TOKEN) as client:
        first = client.acquire("shop.example", pool="eu", ttl=60)
        # Renewals work until the pool retires the member.
        with pytest.raises(ProxyRetiring) as refused:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                client.renew(first, ttl=60)
                time.sleep(0.5)
        assert refused.value.status == 409 and refused.value.code == "proxy_retiring"
        client.release(first)

        hosts = HostLeases(client, LeaseTerms(pool="eu", ttl=4), on_event=events.append)
        lease = hosts.get("news.example")
        # Held across the next retirement: a renewal is refused, the lease is
        # released and the host gets the successor.
        moved = wait_for(
            "the host's lease to move to a successor",
            30,
            lambda: (l := hosts.get("news.example")).proxy.name != lease.proxy.name and l,
        )
        assert "retired" in events, events
        assert aging_pool.active_leases().get(lease.proxy.name, 0) == 0, "the old lease was released"
        assert moved.proxy.name.startswith("eu-")
        hosts.close()
