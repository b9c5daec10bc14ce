"""Retries against a scripted server on loopback: ``Retry-After`` is
honoured (429 and 503 alike), other errors are not retried, and the total
wait is bounded."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time
from typing import Any, Iterator, List, Tuple

import pytest

from egress_proxies import AsyncLeaseClient, InvalidRequest, LeaseClient, NoCapacity, RateLimited, RetryPolicy

LEASE = {
    "id": "0ee23cc7-f696-4c92-9307-c5badbe125c9",
    "proxy": {"name": "p", "namespace": "crawl", "url": "http://u:pw@127.0.0.1:1", "attributes": {}},
    "target": "shop.example",
    "expiresAt": "2026-11-30T01:07:35.573532466Z",
}

Answer = Tuple[int, Any, dict]


class Scripted:
    """Answers ``POST /v1/leases`` from a script; records when each request came."""

    def __init__(self, script: List[Answer]):
        self.script = list(script)
        self.times: List[float] = []
        scripted = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                scripted.times.append(time.monotonic())
                status, body, headers = scripted.script.pop(0)
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def gaps(self) -> List[float]:
        return [b - a for a, b in zip(self.times, self.times[1:])]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted() -> Iterator[Any]:
    made: List[Scripted] = []

    def make(*script: Answer) -> Scripted:
        made.append(Scripted(list(script)))
        return made[-1]

    yield make
    for s in made:
        s.close()


def rate_limited(after: str) -> Answer:
    return 429, {"error": "rate_limited", "message": "over the per-client limit"}, {"Retry-After": after}


def unavailable(after: str) -> Answer:
    return 503, {"error": "unavailable", "message": "journal slow"}, {"Retry-After": after}


NO_CAPACITY: Answer = (503, {"error": "no_capacity", "message": "nothing eligible"}, {})
GRANTED: Answer = (201, LEASE, {})


def test_retry_after_is_waited_for_then_the_lease_is_granted(scripted: Any) -> None:
    server = scripted(rate_limited("1"), unavailable("1"), GRANTED)
    with LeaseClient(server.url, "t", retry=RetryPolicy(max_wait=10)) as client:
        lease = client.acquire("shop.example")
    assert lease.id == LEASE["id"]
    assert len(server.times) == 3
    assert all(0.95 <= gap < 2.5 for gap in server.gaps()), server.gaps()


def test_the_asyncio_client_waits_for_retry_after_too(scripted: Any) -> None:
    server = scripted(rate_limited("1"), GRANTED)

    async def run() -> str:
        async with AsyncLeaseClient(server.url, "t", retry=RetryPolicy(max_wait=10)) as client:
            return (await client.acquire("shop.example")).id

    assert asyncio.run(run()) == LEASE["id"]
    assert 0.95 <= server.gaps()[0] < 2.5, server.gaps()


def test_without_retry_after_the_client_backs_off(scripted: Any) -> None:
    server = scripted(NO_CAPACITY, NO_CAPACITY, GRANTED)
    policy = RetryPolicy(max_wait=10, initial_backoff=0.2, max_backoff=1)
    with LeaseClient(server.url, "t", retry=policy) as client:
        client.acquire("shop.example")
    first, second = server.gaps()
    assert 0.1 <= first < 0.6 and 0.2 <= second < 1.0, server.gaps()


def test_a_retry_after_beyond_the_budget_fails_at_once(scripted: Any) -> None:
    server = scripted(rate_limited("30"))
    with LeaseClient(server.url, "t", retry=RetryPolicy(max_wait=5)) as client:
        started = time.monotonic()
        with pytest.raises(RateLimited) as raised:
            client.acquire("shop.example")
    assert raised.value.retry_after == 30
    assert time.monotonic() - started < 1


def test_no_capacity_is_raised_once_the_budget_is_spent(scripted: Any) -> None:
    server = scripted(*[NO_CAPACITY] * 50)
    with LeaseClient(server.url, "t", retry=RetryPolicy(max_wait=1, initial_backoff=0.1, max_backoff=0.2)) as client:
        started = time.monotonic()
        with pytest.raises(NoCapacity):
            client.acquire("shop.example")
    assert time.monotonic() - started < 1.5
    assert len(server.times) >= 3


def test_other_errors_are_not_asked_again(scripted: Any) -> None:
    server = scripted((400, {"error": "invalid_request", "message": "target: has a port"}, {}), GRANTED)
    with LeaseClient(server.url, "t") as client:
        with pytest.raises(InvalidRequest, match="target: has a port"):
            client.acquire("shop.example:443")
    assert len(server.times) == 1
