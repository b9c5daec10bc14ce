"""The API's operations as data — method, path, body and how to read the
answer — shared by the sync and the asyncio client, which only send them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, List, Mapping, Optional, Tuple, TypeVar, Union
from urllib.parse import quote

import httpx

from .errors import api_error
from .models import Lease, Outcome, ProxyInfo, Renewal

T = TypeVar("T")

#: Where the API is when neither an argument nor ``EGRESS_PROXIES_URL`` says.
DEFAULT_URL = "http://127.0.0.1:8090"
#: The server refuses longer report details (it does not cut them).
MAX_DETAIL_CHARS = 1024
#: The server refuses longer client names.
MAX_CLIENT_CHARS = 128

LeaseRef = Union[str, Lease]


def resolve_url(url: Optional[str]) -> str:
    return (url or os.environ.get("EGRESS_PROXIES_URL") or DEFAULT_URL).rstrip("/")


#: Where the crawler token is read from when no argument gives it, first
#: match wins: a crawler pod's variable, then the operator's own (handy
#: beside a standalone operator).
TOKEN_VARIABLES = ("EGRESS_PROXIES_TOKEN", "DISCOVERY_TOKEN")


def resolve_token(token: Optional[str]) -> Optional[str]:
    if token is not None:
        return token
    for name in TOKEN_VARIABLES:
        value = os.environ.get(name)
        if value:
            return value
    return None


def headers(token: Optional[str]) -> Dict[str, str]:
    out = {"Accept": "application/json", "User-Agent": "egress-proxies-python"}
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    read: Callable[[httpx.Response], T]
    body: Optional[Dict[str, Any]] = None
    params: Optional[httpx.QueryParams] = None


def check(response: httpx.Response) -> None:
    """Raises the error a non-2xx answer stands for."""
    if response.is_success:
        return
    try:
        body: object = response.json()
    except ValueError:
        body = None
    raise api_error(response.status_code, body, response.headers)


def _nothing(_: httpx.Response) -> None:
    return None


def lease_id(lease: LeaseRef) -> str:
    return lease.id if isinstance(lease, Lease) else lease


def _path(lease: LeaseRef, rest: str = "") -> str:
    return f"/v1/leases/{quote(lease_id(lease), safe='')}{rest}"


def acquire(
    target: str,
    selector: Optional[Mapping[str, str]],
    pool: Optional[str],
    ttl: Optional[int],
    client: Optional[str],
) -> Call[Lease]:
    wanted = dict(selector or {})
    body: Dict[str, Any] = {"target": target}
    if wanted:
        body["selector"] = wanted
    if pool is not None:
        body["pool"] = pool
    if ttl is not None:
        body["ttlSeconds"] = int(ttl)
    if client:
        body["client"] = client[:MAX_CLIENT_CHARS]
    return Call("POST", "/v1/leases", lambda r: Lease.from_json(r.json()), body=body)


def release(lease: LeaseRef) -> Call[None]:
    return Call("DELETE", _path(lease), _nothing)


def report(lease: LeaseRef, outcome: Union[Outcome, str], detail: Optional[str]) -> Call[None]:
    body: Dict[str, Any] = {"outcome": Outcome(outcome).value}
    if detail:
        body["detail"] = detail[:MAX_DETAIL_CHARS]
    return Call("POST", _path(lease, "/report"), _nothing, body=body)


def renew(lease: LeaseRef, ttl: Optional[int]) -> Call[Renewal]:
    body = {"ttlSeconds": int(ttl)} if ttl is not None else None
    return Call("POST", _path(lease, "/renew"), lambda r: Renewal.from_json(r.json()), body=body)


def list_proxies(attributes: Optional[Mapping[str, str]], healthy: Optional[bool]) -> Call[List[ProxyInfo]]:
    params = httpx.QueryParams()
    for key, value in (attributes or {}).items():
        params = params.add("attr", f"{key}={value}")
    if healthy is not None:
        params = params.add("healthy", "true" if healthy else "false")
    return Call(
        "GET", "/v1/proxies", lambda r: [ProxyInfo.from_json(p) for p in r.json()], params=params
    )


def outcome_for(
    error: BaseException,
    blocked_on: Tuple[type, ...],
    error_on: Tuple[type, ...],
) -> Optional[Outcome]:
    """What an exception leaving ``with client.lease(...)`` says about the proxy."""
    if isinstance(error, blocked_on):
        return Outcome.BLOCKED
    if isinstance(error, error_on):
        return Outcome.ERROR
    return None


def detail_of(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__

