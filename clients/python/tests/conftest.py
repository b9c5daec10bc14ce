"""Fixtures: one operator for the session (5 local proxies with distinct
outgoing loopback addresses: three in group ``crawl``, and ``spare-1`` and
``spare-2`` alone in their groups, for the tests whose reports make a proxy
rest for every target), and test sites on loopback addresses of their own.

``EPO_OPERATOR_BIN`` names the operator binary (the Rust test
``actors/tests/python_clients.rs`` sets it); ``EPO_TEST_ROOT`` where the
operator keeps its files (default: a pytest temporary directory)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from harness import CRAWLER_TOKEN, Operator, ProxySpec, Site

from egress_proxies import LeaseClient

CRAWL = {"group": "crawl"}
_site_hosts = (f"127.0.2.{n}" for n in itertools.count(1))


@pytest.fixture(scope="session")
def operator_binary() -> str:
    binary = os.environ.get("EPO_OPERATOR_BIN")
    if not binary:
        pytest.skip("EPO_OPERATOR_BIN is not set (actors/tests/python_clients.rs runs these tests)")
    return binary


@pytest.fixture(scope="session")
def operator(tmp_path_factory: pytest.TempPathFactory, operator_binary: str) -> Iterator[Operator]:
    binary = operator_binary
    root = Path(os.environ.get("EPO_TEST_ROOT") or tmp_path_factory.mktemp("operator"))
    proxies = [ProxySpec(f"crawl-{i}", CRAWL) for i in (1, 2, 3)]
    proxies += [ProxySpec(name, {"group": name}) for name in ("spare-1", "spare-2")]
    op = Operator(binary, root, proxies, max_leases_per_proxy=2, cooldown="1s")
    try:
        op.start()
        yield op
    finally:
        op.stop()


@pytest.fixture
def client(operator: Operator) -> Iterator[LeaseClient]:
    with LeaseClient(operator.url, CRAWLER_TOKEN) as c:
        yield c


@pytest.fixture
def make_site() -> Iterator[Callable[..., Site]]:
    """Starts sites, each on a loopback address of its own (its own target)."""
    sites = []

    def make(**kwargs: object) -> Site:
        site = Site(next(_site_hosts), **kwargs).start()  # type: ignore[arg-type]
        sites.append(site)
        return site

    yield make
    for site in sites:
        site.stop()
