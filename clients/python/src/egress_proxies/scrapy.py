"""A Scrapy downloader middleware that sends every request through a leased
proxy: one lease per target host, renewed while the crawl uses it, reported
``blocked`` (and the request retried on another proxy) when the target
blocks it, reported ``error`` when the proxy cannot be reached, and all
released when the spider closes.

Enable it before Scrapy's ``HttpProxyMiddleware`` (750), which turns the
credentials in the lease's proxy URL into ``Proxy-Authorization``::

    DOWNLOADER_MIDDLEWARES = {"egress_proxies.scrapy.LeaseMiddleware": 610}

It needs Scrapy's asyncio reactor (the default since Scrapy 2.13). Every
setting is listed in docs/clients.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional, Tuple, Type, Union

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.reactor import is_asyncio_reactor_installed
from twisted.internet.error import ConnectError, ConnectionLost, TimeoutError as TwistedTimeoutError

from .aio import AsyncLeaseClient
from .blocking import DEFAULT_BLOCKED_STATUSES, BlockRules
from .errors import ProxyFailed
from .host_leases import AsyncHostLeases, LeaseTerms
from .models import Lease, Outcome
from .retry import RetryPolicy

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

log = logging.getLogger("egress_proxies.scrapy")

#: ``request.meta`` key holding the :class:`~egress_proxies.Lease` a request went out on.
META_LEASE = "egress_proxies_lease"
#: ``request.meta`` key: set it true to send a request without a lease.
META_SKIP = "egress_proxies_skip"
#: ``request.meta`` key counting how often a request was retried after a block.
META_BLOCK_RETRIES = "egress_proxies_block_retries"


def _proxy_failures() -> Tuple[Type[BaseException], ...]:
    """Exceptions that mean the proxy failed, not the target: Scrapy raises
    them when it cannot reach the proxy or the proxy refuses the tunnel."""
    failures: Tuple[Type[BaseException], ...] = (
        ConnectError,
        ConnectionLost,
        TwistedTimeoutError,
        ConnectionError,
        ProxyFailed,
    )
    try:
        from scrapy.core.downloader.handlers.http11 import TunnelError

        failures += (TunnelError,)
    except ImportError:
        pass
    return failures


PROXY_FAILURES = _proxy_failures()


class LeaseMiddleware:
    """See the module's documentation."""

    def __init__(self, crawler: Crawler):
        settings = crawler.settings
        self._stats = crawler.stats
        self._client = AsyncLeaseClient(
            settings.get("EGRESS_PROXIES_URL"),
            settings.get("EGRESS_PROXIES_TOKEN"),
            timeout=settings.getfloat("EGRESS_PROXIES_API_TIMEOUT", 10.0),
            retry=RetryPolicy(max_wait=settings.getfloat("EGRESS_PROXIES_ACQUIRE_TIMEOUT", 60.0)),
        )
        spider_name = getattr(crawler.spidercls, "name", None) or "spider"
        terms = LeaseTerms(
            selector=settings.getdict("EGRESS_PROXIES_SELECTOR") or None,
            pool=settings.get("EGRESS_PROXIES_POOL"),
            ttl=settings.getint("EGRESS_PROXIES_TTL", 300),
            client=settings.get("EGRESS_PROXIES_CLIENT") or f"scrapy/{spider_name}",
        )
        self._leases = AsyncHostLeases(self._client, terms, self._count)
        self._rules = BlockRules.of(
            settings.getlist("EGRESS_PROXIES_BLOCKED_STATUSES", sorted(DEFAULT_BLOCKED_STATUSES)),
            settings.getlist("EGRESS_PROXIES_BLOCKED_MARKERS", []),
        )
        self._block_retries = settings.getint("EGRESS_PROXIES_BLOCK_RETRIES", 3)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> LeaseMiddleware:
        if not crawler.settings.getbool("EGRESS_PROXIES_ENABLED", True):
            raise NotConfigured("EGRESS_PROXIES_ENABLED is off")
        if not is_asyncio_reactor_installed():
            # Not NotConfigured: the crawl would then go out without proxies.
            raise RuntimeError(
                "egress_proxies.scrapy.LeaseMiddleware needs the asyncio reactor: set "
                "TWISTED_REACTOR = 'twisted.internet.asyncioreactor.AsyncioSelectorReactor'"
            )
        middleware = cls(crawler)
        crawler.signals.connect(middleware.spider_closed, signal=signals.spider_closed)
        return middleware

    async def process_request(self, request: Request, spider: Optional[Spider] = None) -> None:
        if request.meta.get(META_SKIP):
            return None
        if request.meta.get("proxy") is not None and META_LEASE not in request.meta:
            return None  # a proxy the spider chose itself
        host = urlparse_cached(request).hostname
        if not host:
            return None
        lease = await self._leases.get(host)
        request.meta["proxy"] = lease.proxy.url
        request.meta[META_LEASE] = lease
        return None

    async def process_response(
        self, request: Request, response: Response, spider: Optional[Spider] = None
    ) -> Union[Request, Response]:
        lease = self._lease_of(request)
        if lease is None:
            return response
        verdict = self._rules.verdict(response.status, response.body if self._rules.reads_body else b"")
        if verdict is None:
            return response
        host = urlparse_cached(request).hostname or lease.target
        if await self._leases.drop(host, lease, Outcome.BLOCKED, f"{verdict} on {request.url}"):
            log.info("proxy %s blocked by %s (%s): reported, taking another", lease.proxy.name, host, verdict)
        retries = int(request.meta.get(META_BLOCK_RETRIES, 0))
        if retries >= self._block_retries:
            log.warning("%s still blocked after %d other proxies; giving up on it", request.url, retries)
            return response
        retry = request.replace(dont_filter=True)
        retry.meta[META_BLOCK_RETRIES] = retries + 1
        self._count("block_retries")
        return retry

    async def process_exception(
        self, request: Request, exception: Exception, spider: Optional[Spider] = None
    ) -> None:
        lease = self._lease_of(request)
        if lease is None or not isinstance(exception, PROXY_FAILURES):
            return None
        host = urlparse_cached(request).hostname or lease.target
        detail = f"{type(exception).__name__}: {exception} on {request.url}"
        if await self._leases.drop(host, lease, Outcome.ERROR, detail):
            log.info("proxy %s failed (%s): reported, taking another", lease.proxy.name, detail)
        # Scrapy's RetryMiddleware may retry the request: it gets another lease.
        return None

    async def spider_closed(self, spider: Spider) -> None:
        """Releases every lease."""
        await self._leases.close()
        await self._client.aclose()

    def _lease_of(self, request: Request) -> Optional[Lease]:
        lease = request.meta.get(META_LEASE)
        return lease if isinstance(lease, Lease) else None

    def _count(self, event: str) -> None:
        if self._stats is not None:
            self._stats.inc_value(f"egress_proxies/{event}")


__all__ = ["LeaseMiddleware", "META_LEASE", "META_SKIP", "META_BLOCK_RETRIES", "PROXY_FAILURES"]

