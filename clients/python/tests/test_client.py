"""The sync client against the real operator."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List

import httpx
import pytest

from harness import CRAWLER_TOKEN, READ_TOKEN, Operator, wait_for

from egress_proxies import (
    Blocked,
    Forbidden,
    LeaseClient,
    NoCapacity,
    Outcome,
    ProxyFailed,
    RetryPolicy,
    Unauthorized,
    UnknownLease,
)

CRAWL = {"group": "crawl"}
#: The package's sources, as a crawler image would install them.
SRC = Path(__file__).resolve().parent.parent / "src"


def test_acquire_renew_report_release_and_list(client: LeaseClient, operator: Operator) -> None:
    lease = client.acquire("Shop.Example", selector=CRAWL, ttl=60, client="pytest")
    assert lease.target == "shop.example"
    assert lease.proxy.name.startswith("crawl-")
    assert lease.proxy.username and lease.proxy.password
    assert lease.proxy.password in lease.proxy.url
    assert lease.proxy.password not in repr(lease), "credentials stay out of repr"
    listed = {p.name: p for p in client.list(attributes=CRAWL, healthy=True)}
    assert set(listed) == {"crawl-1", "crawl-2", "crawl-3"}
    assert listed[lease.proxy.name].active_leases == 1
    assert listed[lease.proxy.name].url and "@" not in listed[lease.proxy.name].url
    renewal = client.renew(lease, ttl=120)
    assert renewal.id == lease.id and renewal.ttl_seconds == 120
    assert renewal.expires_at > lease.expires_at
    client.report(lease, Outcome.OK, "fine")
    client.release(lease)
    client.release(lease.id)  # idempotent
    with pytest.raises(UnknownLease):
        client.renew(lease)
    assert operator.active_leases()[lease.proxy.name] == 0


def test_configured_from_the_environment(operator: Operator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EGRESS_PROXIES_URL", operator.url)
    monkeypatch.setenv("DISCOVERY_TOKEN", CRAWLER_TOKEN)
    with LeaseClient() as client:
        assert {p.name for p in client.list()} >= {"crawl-1", "spare-1"}
    monkeypatch.setenv("DISCOVERY_TOKEN", "wrong")
    with LeaseClient() as client:
        with pytest.raises(Unauthorized):
            client.list()


def test_a_documented_crawler_pods_environment_leases(operator: Operator) -> None:
    # A crawler pod as docs/install.md and docs/clients.md set it up has the
    # API's URL and the token in these two variables and nothing else of
    # ours: a fresh interpreter with only them (and what Python needs) leases.
    script = (
        "from egress_proxies import LeaseClient\n"
        "with LeaseClient() as client:\n"
        "    lease = client.acquire('pod.example', selector={'group': 'crawl'})\n"
        "    client.release(lease)\n"
        "    print(lease.proxy.name)\n"
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(SRC),
        "EGRESS_PROXIES_URL": operator.url,
        "EGRESS_PROXIES_TOKEN": CRAWLER_TOKEN,
    }
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("crawl-"), done.stdout


def test_the_crawler_pods_variable_wins_over_the_operators(operator: Operator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EGRESS_PROXIES_URL", operator.url)
    monkeypatch.setenv("EGRESS_PROXIES_TOKEN", CRAWLER_TOKEN)
    monkeypatch.setenv("DISCOVERY_TOKEN", "wrong")
    with LeaseClient() as client:
        assert client.list()
    monkeypatch.setenv("EGRESS_PROXIES_TOKEN", "wrong")
    monkeypatch.setenv("DISCOVERY_TOKEN", CRAWLER_TOKEN)
    with LeaseClient() as client:
        with pytest.raises(Unauthorized):
            client.list()


def test_the_read_token_lists_but_cannot_lease(operator: Operator) -> None:
    with LeaseClient(operator.url, READ_TOKEN) as reader:
        assert reader.list()
        with pytest.raises(Forbidden):
            reader.acquire("shop.example")


def test_the_lease_block_releases_and_reports_blocked(client: LeaseClient, operator: Operator) -> None:
    with pytest.raises(Blocked):
        with client.lease("blocked.example", selector=CRAWL) as lease:
            blocked = lease.proxy.name
            raise Blocked("captcha on /search")
    assert operator.active_leases()[blocked] == 0
    # Blocked rests the proxy for this target for minutes (a plain release:
    # one second): every lease for it now goes to the other proxies.
    time.sleep(1.2)
    taken = [client.acquire("blocked.example", selector=CRAWL) for _ in range(4)]
    try:
        assert blocked not in {t.proxy.name for t in taken}
        with LeaseClient(operator.url, CRAWLER_TOKEN, retry=RetryPolicy(max_wait=0)) as impatient:
            with pytest.raises(NoCapacity):
                impatient.acquire("blocked.example", selector=CRAWL)
    finally:
        for t in taken:
            client.release(t)


def test_the_lease_block_reports_error_when_the_proxy_fails(client: LeaseClient, operator: Operator) -> None:
    spare = {"group": "spare-1"}
    with pytest.raises(httpx.ProxyError):
        with client.lease("one.example", selector=spare):
            raise httpx.ProxyError("the proxy hung up")
    # `error` rests the proxy for every target.
    with LeaseClient(operator.url, CRAWLER_TOKEN, retry=RetryPolicy(max_wait=0)) as impatient:
        with pytest.raises(NoCapacity):
            impatient.acquire("another.example", selector=spare)
    assert operator.active_leases()["spare-1"] == 0


def test_an_ordinary_exception_only_releases(client: LeaseClient, operator: Operator) -> None:
    with pytest.raises(KeyError):
        with client.lease("plain.example", selector=CRAWL) as lease:
            raise KeyError("a bug in the crawler")
    assert operator.active_leases()[lease.proxy.name] == 0
    # Nothing was reported: after the release's one-second rest the proxy
    # takes leases for the target again, so all six places are granted.
    time.sleep(1.2)
    taken = [client.acquire("plain.example", selector=CRAWL) for _ in range(6)]
    for t in taken:
        client.release(t)
    assert lease.proxy.name in {t.proxy.name for t in taken}


def test_no_capacity_is_waited_out_until_a_release(client: LeaseClient, operator: Operator) -> None:
    """Every crawl proxy full (3 proxies x 2 leases): an acquire waits,
    asking again with backoff, and gets the capacity a release frees."""
    held = [client.acquire(f"full-{i}.example", selector=CRAWL) for i in range(6)]
    got: List[str] = []
    failed: List[BaseException] = []

    def wait_for_lease() -> None:
        try:
            with LeaseClient(operator.url, CRAWLER_TOKEN, retry=RetryPolicy(max_wait=20)) as patient:
                lease = patient.acquire("waiting.example", selector=CRAWL)
                got.append(lease.proxy.name)
                patient.release(lease)
        except BaseException as error:  # reported by the assertion below
            failed.append(error)

    waiter = threading.Thread(target=wait_for_lease)
    waiter.start()
    time.sleep(1.0)
    assert not got and not failed, "nothing was free: the acquire is still waiting"
    client.release(held[0])
    waiter.join(timeout=25)
    assert not failed, failed
    assert got == [held[0].proxy.name]
    for lease in held[1:]:
        client.release(lease)
    wait_for("no lease held", 5, lambda: not any(operator.active_leases().values()))
