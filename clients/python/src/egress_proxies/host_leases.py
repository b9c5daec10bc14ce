"""One lease per target host, for clients that fetch from many hosts (the
Scrapy middleware, the requests and httpx helpers): taken on first use,
renewed once half its time is gone, dropped — reported and released — when
the proxy is blocked or fails, and all released on close."""

from __future__ import annotations

import asyncio
import datetime as _dt
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional

from .aio import AsyncLeaseClient
from .client import LeaseClient, _logged
from .errors import ProxyRetiring, UnknownLease
from .models import Lease, Outcome


@dataclass(frozen=True)
class LeaseTerms:
    """What every lease is asked for."""

    selector: Optional[Mapping[str, str]] = None
    pool: Optional[str] = None
    ttl: int = 300
    client: Optional[str] = None


class _Held:
    """A lease and when to renew it (by this machine's monotonic clock:
    the server's clock may differ)."""

    def __init__(self, lease: Lease, ttl: float):
        self.lease = lease
        self.renew_at = time.monotonic() + ttl / 2

    @classmethod
    def granted(cls, lease: Lease, asked: int) -> _Held:
        left = (lease.expires_at - _dt.datetime.now(_dt.timezone.utc)).total_seconds()
        return cls(lease, max(1.0, min(float(asked), left)))

    def due(self) -> bool:
        return time.monotonic() >= self.renew_at


Event = Callable[[str], None]


def _ignore(_: str) -> None:
    return None


class HostLeases:
    """Leases per host for threads sharing a :class:`LeaseClient`."""

    def __init__(self, client: LeaseClient, terms: LeaseTerms = LeaseTerms(), on_event: Event = _ignore):
        self._client = client
        self._terms = terms
        self._event = on_event
        self._held: Dict[str, _Held] = {}
        self._locks: Dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, host: str) -> Lease:
        """The lease for ``host``: the one held, renewed when due, or a new one."""
        with self._lock(host):
            held = self._held.get(host)
            if held is not None and held.due():
                try:
                    renewal = self._client.renew(held.lease, self._terms.ttl)
                    held = _Held(held.lease, renewal.ttl_seconds)
                    self._event("renewed")
                except UnknownLease:
                    held = None  # it expired: take another
                except ProxyRetiring:
                    # Its pool is replacing the proxy: hand it back, take another.
                    with _logged(f"releasing lease {held.lease.id} on a retiring proxy"):
                        self._client.release(held.lease)
                    self._event("retired")
                    held = None
            if held is None:
                t = self._terms
                lease = self._client.acquire(host, selector=t.selector, pool=t.pool, ttl=t.ttl, client=t.client)
                held = _Held.granted(lease, t.ttl)
                self._event("acquired")
            self._held[host] = held
            return held.lease

    def drop(self, host: str, lease: Lease, outcome: Optional[Outcome] = None, detail: Optional[str] = None) -> bool:
        """Reports ``outcome`` on ``lease`` and releases it — only when it is
        still the host's lease (requests in flight on it all fail alike;
        the first to tell counts). Returns whether it did."""
        with self._lock(host):
            held = self._held.get(host)
            if held is None or held.lease.id != lease.id:
                return False
            del self._held[host]
        with _logged(f"reporting and releasing lease {lease.id}"):
            if outcome is not None:
                self._client.report(lease, outcome, detail)
                self._event(outcome.value)
            self._client.release(lease)
            self._event("released")
        return True

    def close(self) -> None:
        """Releases every lease."""
        with self._guard:
            held, self._held = list(self._held.values()), {}
        for h in held:
            with _logged(f"releasing lease {h.lease.id}"):
                self._client.release(h.lease)
                self._event("released")

    def _lock(self, host: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(host, threading.Lock())


class AsyncHostLeases:
    """:class:`HostLeases` for the tasks of one event loop."""

    def __init__(self, client: AsyncLeaseClient, terms: LeaseTerms = LeaseTerms(), on_event: Event = _ignore):
        self._client = client
        self._terms = terms
        self._event = on_event
        self._held: Dict[str, _Held] = {}
        self._locks: Dict[str, asyncio.Lock] = {}

    async def get(self, host: str) -> Lease:
        async with self._lock(host):
            held = self._held.get(host)
            if held is not None and held.due():
                try:
                    renewal = await self._client.renew(held.lease, self._terms.ttl)
                    held = _Held(held.lease, renewal.ttl_seconds)
                    self._event("renewed")
                except UnknownLease:
                    held = None
                except ProxyRetiring:
                    with _logged(f"releasing lease {held.lease.id} on a retiring proxy"):
                        await self._client.release(held.lease)
                    self._event("retired")
                    held = None
            if held is None:
                t = self._terms
                lease = await self._client.acquire(host, selector=t.selector, pool=t.pool, ttl=t.ttl, client=t.client)
                held = _Held.granted(lease, t.ttl)
                self._event("acquired")
            self._held[host] = held
            return held.lease

    async def drop(
        self, host: str, lease: Lease, outcome: Optional[Outcome] = None, detail: Optional[str] = None
    ) -> bool:
        async with self._lock(host):
            held = self._held.get(host)
            if held is None or held.lease.id != lease.id:
                return False
            del self._held[host]
        with _logged(f"reporting and releasing lease {lease.id}"):
            if outcome is not None:
                await self._client.report(lease, outcome, detail)
                self._event(outcome.value)
            await self._client.release(lease)
            self._event("released")
        return True

    async def close(self) -> None:
        held, self._held = list(self._held.values()), {}
        for h in held:
            with _logged(f"releasing lease {h.lease.id}"):
                await self._client.release(h.lease)
                self._event("released")

    def _lock(self, host: str) -> asyncio.Lock:
        return self._locks.setdefault(host, asyncio.Lock())
