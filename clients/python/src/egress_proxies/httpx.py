"""``httpx`` transports that fetch every host through a leased proxy::

    with httpx.Client(transport=LeasedTransport()) as http:
        http.get("https://shop.example/")

    async with httpx.AsyncClient(transport=AsyncLeasedTransport()) as http:
        await http.get("https://shop.example/")

One lease per host, renewed while in use. An answer the block rules call a
block is reported ``blocked`` and the request sent again through another
proxy (``block_retries`` times, then the blocked answer is returned); a
proxy that cannot be reached is reported ``error`` and the exception
raised. Closing the transport (the client closes it) releases every lease.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

import httpx

from .aio import AsyncLeaseClient
from .blocking import BlockRules
from .client import LeaseClient
from .host_leases import AsyncHostLeases, HostLeases, LeaseTerms
from .models import Lease, Outcome

#: httpx exceptions that mean the proxy failed.
PROXY_FAILURES = (httpx.ProxyError, httpx.ConnectError, httpx.ConnectTimeout)


class LeasedTransport(httpx.BaseTransport):
    """See the module's documentation. ``client`` defaults to a
    :class:`LeaseClient` configured from the environment (closed with the
    transport)."""

    def __init__(
        self,
        client: Optional[LeaseClient] = None,
        *,
        selector: Optional[Mapping[str, str]] = None,
        pool: Optional[str] = None,
        ttl: int = 300,
        client_name: Optional[str] = None,
        block_rules: BlockRules = BlockRules(),
        block_retries: int = 2,
    ):
        self._own_client = client is None
        self.lease_client = client if client is not None else LeaseClient()
        self.leases = HostLeases(self.lease_client, LeaseTerms(selector, pool, ttl, client_name))
        self.block_rules = block_rules
        self.block_retries = block_retries
        # A transport per host, through the proxy of the lease it was made for.
        self._transports: Dict[str, Tuple[str, httpx.HTTPTransport]] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        request.read()  # a blocked request is sent again: its body must be in memory
        attempt = 0
        while True:
            lease = self.leases.get(host)
            try:
                response = self._transport(host, lease).handle_request(request)
            except PROXY_FAILURES as error:
                self.leases.drop(host, lease, Outcome.ERROR, f"{type(error).__name__}: {error}")
                raise
            if self.block_rules.reads_body:
                response.read()
            verdict = self.block_rules.verdict(response.status_code, response.content if self.block_rules.reads_body else b"")
            if verdict is None:
                return response
            self.leases.drop(host, lease, Outcome.BLOCKED, f"{verdict} on {request.url}")
            if attempt >= self.block_retries:
                return response
            attempt += 1
            response.close()

    def _transport(self, host: str, lease: Lease) -> httpx.HTTPTransport:
        current = self._transports.get(host)
        if current is not None and current[0] == lease.id:
            return current[1]
        if current is not None:
            current[1].close()
        transport = httpx.HTTPTransport(proxy=lease.proxy.url)
        self._transports[host] = (lease.id, transport)
        return transport

    def close(self) -> None:
        self.leases.close()
        for _, transport in self._transports.values():
            transport.close()
        self._transports.clear()
        if self._own_client:
            self.lease_client.close()


class AsyncLeasedTransport(httpx.AsyncBaseTransport):
    """:class:`LeasedTransport` for ``httpx.AsyncClient``; ``client``
    defaults to an :class:`AsyncLeaseClient` configured from the environment."""

    def __init__(
        self,
        client: Optional[AsyncLeaseClient] = None,
        *,
        selector: Optional[Mapping[str, str]] = None,
        pool: Optional[str] = None,
        ttl: int = 300,
        client_name: Optional[str] = None,
        block_rules: BlockRules = BlockRules(),
        block_retries: int = 2,
    ):
        self._own_client = client is None
        self.lease_client = client if client is not None else AsyncLeaseClient()
        self.leases = AsyncHostLeases(self.lease_client, LeaseTerms(selector, pool, ttl, client_name))
        self.block_rules = block_rules
        self.block_retries = block_retries
        self._transports: Dict[str, Tuple[str, httpx.AsyncHTTPTransport]] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        await request.aread()
        attempt = 0
        while True:
            lease = await self.leases.get(host)
            try:
                response = await (await self._transport(host, lease)).handle_async_request(request)
            except PROXY_FAILURES as error:
                await self.leases.drop(host, lease, Outcome.ERROR, f"{type(error).__name__}: {error}")
                raise
            if self.block_rules.reads_body:
                await response.aread()
            verdict = self.block_rules.verdict(response.status_code, response.content if self.block_rules.reads_body else b"")
            if verdict is None:
                return response
            await self.leases.drop(host, lease, Outcome.BLOCKED, f"{verdict} on {request.url}")
            if attempt >= self.block_retries:
                return response
            attempt += 1
            await response.aclose()

    async def _transport(self, host: str, lease: Lease) -> httpx.AsyncHTTPTransport:
        current = self._transports.get(host)
        if current is not None and current[0] == lease.id:
            return current[1]
        if current is not None:
            await current[1].aclose()
        transport = httpx.AsyncHTTPTransport(proxy=lease.proxy.url)
        self._transports[host] = (lease.id, transport)
        return transport

    async def aclose(self) -> None:
        await self.leases.close()
        for _, transport in self._transports.values():
            await transport.aclose()
        self._transports.clear()
        if self._own_client:
            await self.lease_client.aclose()
