"""The lease API's JSON bodies as typed objects.

Field names are the API's in snake case (``expiresAt`` is ``expires_at``);
``tests/test_openapi_models.py`` checks every model against the
``/v1/openapi.json`` the operator serves, so the two cannot drift.
"""

from __future__ import annotations

import datetime as _dt
import enum
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional


class Outcome(str, enum.Enum):
    """How using a lease went (``POST /v1/leases/{id}/report``)."""

    OK = "ok"
    #: The target blocked this proxy: it rests for that target for a long while.
    BLOCKED = "blocked"
    #: The proxy itself failed: it rests for every target.
    ERROR = "error"


@dataclass(frozen=True)
class ProxyInfo:
    """A proxy as ``GET /v1/proxies`` lists it (never with credentials)."""

    name: str
    namespace: str
    url: Optional[str]
    attributes: Dict[str, str]
    phase: str
    healthy: Optional[bool]
    latency_ms: Optional[int]
    active_leases: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProxyInfo:
        return cls(
            name=data["name"],
            namespace=data["namespace"],
            url=data.get("url"),
            attributes=dict(data.get("attributes") or {}),
            phase=data["phase"],
            healthy=data.get("healthy"),
            latency_ms=data.get("latencyMs"),
            active_leases=data["activeLeases"],
        )


@dataclass(frozen=True)
class LeasedProxy:
    """The proxy of a lease. ``url`` carries its credentials as user-info
    (``http://user:password@host:port``): use it as the HTTP proxy. It and
    ``password`` are kept out of ``repr`` so logs never show them."""

    name: str
    namespace: str
    url: str = field(repr=False)
    attributes: Dict[str, str]
    username: Optional[str] = None
    password: Optional[str] = field(default=None, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LeasedProxy:
        return cls(
            name=data["name"],
            namespace=data["namespace"],
            url=data["url"],
            attributes=dict(data.get("attributes") or {}),
            username=data.get("username"),
            password=data.get("password"),
        )


@dataclass(frozen=True)
class Lease:
    """A granted lease: use ``proxy.url`` until ``expires_at``, then renew or release."""

    id: str
    proxy: LeasedProxy
    target: str
    expires_at: _dt.datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Lease:
        return cls(
            id=data["id"],
            proxy=LeasedProxy.from_json(data["proxy"]),
            target=data["target"],
            expires_at=parse_time(data["expiresAt"]),
        )


@dataclass(frozen=True)
class Renewal:
    """A renewed lease: it now ends ``ttl_seconds`` after the renewal."""

    id: str
    expires_at: _dt.datetime
    ttl_seconds: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Renewal:
        return cls(
            id=data["id"],
            expires_at=parse_time(data["expiresAt"]),
            ttl_seconds=data["ttlSeconds"],
        )


_RFC3339 = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:\d{2})$"
)


def parse_time(text: str) -> _dt.datetime:
    """An RFC 3339 time as an aware datetime. The server writes nanoseconds
    and ``Z``, which ``datetime.fromisoformat`` before Python 3.11 refuses."""
    match = _RFC3339.match(text)
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    date, clock, fraction, zone = match.groups()
    micros = (fraction or "0")[:6].ljust(6, "0")
    offset = "+00:00" if zone in ("Z", "z") else zone
    return _dt.datetime.fromisoformat(f"{date}T{clock}.{micros}{offset}")
