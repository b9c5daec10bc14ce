"""Clients for the egress-proxies-operator lease API (docs/api.md).

- :class:`LeaseClient` and :class:`AsyncLeaseClient`: acquire, release,
  report, renew, list; ``with client.lease("shop.example") as lease:``.
- :mod:`egress_proxies.scrapy`: a Scrapy downloader middleware.
- :mod:`egress_proxies.requests` and :mod:`egress_proxies.httpx`: a session
  and transports that lease a proxy per host.

Configured from ``EGRESS_PROXIES_URL`` and ``EGRESS_PROXIES_TOKEN`` (else
``DISCOVERY_TOKEN``) unless given.
"""

from .aio import AsyncLeaseClient
from .blocking import BlockRules
from .client import BLOCKED_EXCEPTIONS, ERROR_EXCEPTIONS, LeaseClient
from .errors import (
    ApiError,
    Blocked,
    EgressProxiesError,
    Forbidden,
    InvalidRequest,
    NoCapacity,
    ProxyFailed,
    ProxyRetiring,
    RateLimited,
    Unauthorized,
    Unavailable,
    UnknownLease,
)
from .host_leases import AsyncHostLeases, HostLeases, LeaseTerms
from .models import Lease, LeasedProxy, Outcome, ProxyInfo, Renewal
from .retry import RetryPolicy

#: The operator version this client belongs to.
__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "AsyncHostLeases",
    "AsyncLeaseClient",
    "BLOCKED_EXCEPTIONS",
    "Blocked",
    "BlockRules",
    "ERROR_EXCEPTIONS",
    "EgressProxiesError",
    "Forbidden",
    "HostLeases",
    "InvalidRequest",
    "Lease",
    "LeaseClient",
    "LeaseTerms",
    "LeasedProxy",
    "NoCapacity",
    "Outcome",
    "ProxyFailed",
    "ProxyInfo",
    "ProxyRetiring",
    "RateLimited",
    "Renewal",
    "RetryPolicy",
    "Unauthorized",
    "Unavailable",
    "UnknownLease",
]
