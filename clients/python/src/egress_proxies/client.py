"""The synchronous lease client."""

from __future__ import annotations

import contextlib
import logging
import time
from types import TracebackType
from typing import Iterator, List, Mapping, Optional, Tuple, Type, TypeVar, Union

import httpx

from . import _calls
from .errors import ApiError, Blocked, ProxyFailed
from .models import Lease, Outcome, ProxyInfo, Renewal
from .retry import RetryPolicy

T = TypeVar("T")
log = logging.getLogger("egress_proxies")

#: Exceptions that make ``lease()`` report ``blocked``.
BLOCKED_EXCEPTIONS: Tuple[Type[BaseException], ...] = (Blocked,)
#: Exceptions that make ``lease()`` report ``error``: the proxy could not
#: be reached or failed the tunnel.
ERROR_EXCEPTIONS: Tuple[Type[BaseException], ...] = (
    ProxyFailed,
    httpx.ProxyError,
    httpx.ConnectError,
    httpx.ConnectTimeout,
    ConnectionError,
)


class LeaseClient:
    """Takes, renews, reports on and gives back leases.

    ``url`` defaults to ``EGRESS_PROXIES_URL`` (else ``http://127.0.0.1:8090``),
    ``token`` to ``EGRESS_PROXIES_TOKEN``, else ``DISCOVERY_TOKEN`` (else none). Answers ``503`` and ``429``
    are asked again per ``retry`` (honouring ``Retry-After``); other errors
    raise at once (see :mod:`egress_proxies.errors`). ``client_name`` is
    sent with every lease, for the operator's logs. Close the client (or use
    it as a context manager) to free its connections.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: float = 10.0,
        retry: RetryPolicy = RetryPolicy(),
        client_name: Optional[str] = None,
        transport: Optional[httpx.BaseTransport] = None,
    ):
        self.url = _calls.resolve_url(url)
        self.retry = retry
        self.client_name = client_name
        self._http = httpx.Client(
            base_url=self.url,
            headers=_calls.headers(_calls.resolve_token(token)),
            timeout=timeout,
            transport=transport,
            trust_env=False,
        )

    def acquire(
        self,
        target: str,
        *,
        selector: Optional[Mapping[str, str]] = None,
        pool: Optional[str] = None,
        ttl: Optional[int] = None,
        client: Optional[str] = None,
    ) -> Lease:
        """A lease on a proxy for ``target`` (a host name, no port): one
        whose attributes contain ``selector`` (and members of ProxyPool ``pool``), for
        ``ttl`` seconds (the server caps it). Waits per the retry policy
        while no proxy is eligible; then raises :class:`NoCapacity`."""
        return self._send(_calls.acquire(target, selector, pool, ttl, client or self.client_name))

    def release(self, lease: Union[str, Lease]) -> None:
        """Gives the lease back (idempotent)."""
        self._send(_calls.release(lease))

    def report(self, lease: Union[str, Lease], outcome: Union[Outcome, str], detail: Optional[str] = None) -> None:
        """Says how the proxy did: ``ok``, ``blocked`` (by the target) or ``error`` (the proxy failed)."""
        self._send(_calls.report(lease, outcome, detail))

    def renew(self, lease: Union[str, Lease], ttl: Optional[int] = None) -> Renewal:
        """Extends a held lease to ``ttl`` seconds from now (default: its own TTL)."""
        return self._send(_calls.renew(lease, ttl))

    def list(self, attributes: Optional[Mapping[str, str]] = None, healthy: Optional[bool] = None) -> List[ProxyInfo]:
        """The fleet (proxies carrying every one of ``attributes``)."""
        return self._send(_calls.list_proxies(attributes, healthy))

    @contextlib.contextmanager
    def lease(
        self,
        target: str,
        *,
        selector: Optional[Mapping[str, str]] = None,
        pool: Optional[str] = None,
        ttl: Optional[int] = None,
        client: Optional[str] = None,
        blocked_on: Tuple[Type[BaseException], ...] = BLOCKED_EXCEPTIONS,
        error_on: Tuple[Type[BaseException], ...] = ERROR_EXCEPTIONS,
    ) -> Iterator[Lease]:
        """``with client.lease("shop.example") as lease:`` — a lease for the
        block, released when it ends. An exception of ``blocked_on`` is
        reported ``blocked``, one of ``error_on`` ``error``; it then goes on."""
        held = self.acquire(target, selector=selector, pool=pool, ttl=ttl, client=client)
        try:
            yield held
        except BaseException as error:
            outcome = _calls.outcome_for(error, blocked_on, error_on)
            # The caller's exception matters more than a failed report or release.
            with _logged("reporting and releasing lease %s" % held.id):
                if outcome is not None:
                    self.report(held, outcome, _calls.detail_of(error))
                self.release(held)
            raise
        self.release(held)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LeaseClient:
        return self

    def __exit__(
        self,
        kind: Optional[Type[BaseException]],
        value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()

    def _send(self, call: _calls.Call[T]) -> T:
        attempts = self.retry.attempts()
        while True:
            response = self._http.request(call.method, call.path, json=call.body, params=call.params)
            try:
                _calls.check(response)
            except ApiError as error:
                delay = attempts.delay_after(error)
                if delay is None:
                    raise
                log.debug("lease API answered %s; asking again in %.2fs", error, delay)
                time.sleep(delay)
                continue
            return call.read(response)


@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    try:
        yield
    except Exception as error:
        log.warning("%s failed: %s", what, error)
