"""Errors: those the API answers with, and the two a crawler raises inside
``with client.lease(...)`` to report how the proxy did."""

from __future__ import annotations

import email.utils
import time
from typing import Dict, Mapping, Optional, Type


class EgressProxiesError(Exception):
    """Base of every error of this package."""


class Blocked(EgressProxiesError):
    """Raise inside ``with client.lease(...)`` when the target blocked the
    proxy (a captcha, a 403): the lease is reported ``blocked`` (the proxy
    rests for that target) and released."""


class ProxyFailed(EgressProxiesError):
    """Raise inside ``with client.lease(...)`` when the proxy itself failed:
    the lease is reported ``error`` (the proxy rests for every target)."""


class ApiError(EgressProxiesError):
    """An error answer of the lease API: ``{"error": code, "message": ...}``."""

    def __init__(self, status: int, code: str, message: str, retry_after: Optional[float] = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        #: Seconds the server asked to wait (``Retry-After``), when it did.
        self.retry_after = retry_after


class InvalidRequest(ApiError):
    """400: a field outside its limit; the message names it."""


class Unauthorized(ApiError):
    """401: no token, or a wrong one (``EGRESS_PROXIES_TOKEN``)."""


class Forbidden(ApiError):
    """403: the read-only token on anything but a ``GET``."""


class UnknownLease(ApiError):
    """404 ``unknown_lease``: renewing a lease that is not held, or
    reporting on one that ended long ago."""


class ProxyRetiring(ApiError):
    """409 ``proxy_retiring``: renewing a lease whose proxy its pool is
    replacing. The lease stays valid until it expires; release it and
    acquire another."""


class RateLimited(ApiError):
    """429: over a rate limit; ``retry_after`` says how long to wait."""


class NoCapacity(ApiError):
    """503 ``no_capacity``: no proxy is eligible for the lease right now."""


class Unavailable(ApiError):
    """Any other 503 (``unavailable``, ``not_leader``, ``lease_store_full``): ask again later."""


_BY_CODE: Dict[str, Type[ApiError]] = {
    "invalid_request": InvalidRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "unknown_lease": UnknownLease,
    "proxy_retiring": ProxyRetiring,
    "rate_limited": RateLimited,
    "no_capacity": NoCapacity,
}
_BY_STATUS: Dict[int, Type[ApiError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    429: RateLimited,
    503: Unavailable,
}


def retry_after_seconds(value: Optional[str]) -> Optional[float]:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def api_error(status: int, body: object, headers: Mapping[str, str]) -> ApiError:
    """The error an answer stands for (bodies that are not the API's own,
    from a proxy or load balancer in between, keep their status)."""
    code, message = "http_error", ""
    if isinstance(body, dict):
        code = str(body.get("error", code))
        message = str(body.get("message", ""))
    kind = _BY_CODE.get(code) or _BY_STATUS.get(status) or ApiError
    return kind(status, code, message, retry_after_seconds(headers.get("retry-after")))
