"""A ``requests`` session that fetches every host through a leased proxy::

    with LeasedSession() as session:
        session.get("https://shop.example/")

One lease per host, renewed while in use. An answer the block rules call a
block is reported ``blocked`` and the request sent again through another
proxy (``block_retries`` times, then the blocked answer is returned); a
proxy that cannot be reached is reported ``error`` and the exception
raised. ``close()`` releases every lease. Redirects to another host go
through the first host's proxy.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union
from urllib.parse import urlsplit

import requests

from .blocking import BlockRules
from .client import LeaseClient
from .host_leases import HostLeases, LeaseTerms
from .models import Outcome

#: ``requests`` exceptions that mean the proxy failed.
PROXY_FAILURES = (requests.exceptions.ProxyError, requests.exceptions.ConnectTimeout)


class LeasedSession(requests.Session):
    """See the module's documentation. ``client`` defaults to a
    :class:`LeaseClient` configured from the environment (closed with the
    session); ``selector``, ``pool``, ``ttl`` and ``client_name`` are what
    every lease is asked for."""

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
        super().__init__()
        self._own_client = client is None
        self.lease_client = client if client is not None else LeaseClient()
        self.leases = HostLeases(self.lease_client, LeaseTerms(selector, pool, ttl, client_name))
        self.block_rules = block_rules
        self.block_retries = block_retries

    def request(
        self, method: Union[str, bytes], url: Union[str, bytes], *args: Any, **kwargs: Any
    ) -> requests.Response:
        text_url = url.decode() if isinstance(url, bytes) else url
        host = urlsplit(text_url).hostname
        if not host:
            return super().request(method, url, *args, **kwargs)
        attempt = 0
        while True:
            lease = self.leases.get(host)
            kwargs["proxies"] = {"http": lease.proxy.url, "https": lease.proxy.url}
            try:
                response = super().request(method, url, *args, **kwargs)
            except PROXY_FAILURES as error:
                self.leases.drop(host, lease, Outcome.ERROR, f"{type(error).__name__}: {error}")
                raise
            body = response.content if self.block_rules.reads_body else b""
            verdict = self.block_rules.verdict(response.status_code, body)
            if verdict is None:
                return response
            self.leases.drop(host, lease, Outcome.BLOCKED, f"{verdict} on {text_url}")
            if attempt >= self.block_retries:
                return response
            attempt += 1
            response.close()

    def close(self) -> None:
        self.leases.close()
        super().close()
        if self._own_client:
            self.lease_client.close()
