"""The client's models and request bodies against the OpenAPI document the
operator serves: a field added, renamed or made optional on either side
fails here."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Dict, Set

import pytest

from harness import Operator

from egress_proxies import _calls, errors
from egress_proxies.models import Lease, LeasedProxy, Outcome, ProxyInfo, Renewal


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def optional(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


@pytest.fixture(scope="module")
def schemas(operator: Operator) -> Dict[str, Any]:
    doc = operator.get("/v1/openapi.json")
    return dict(doc["components"]["schemas"])


@pytest.mark.parametrize("model", [ProxyInfo, LeasedProxy, Lease, Renewal])
def test_each_answer_model_has_exactly_the_schemas_fields(schemas: Dict[str, Any], model: type) -> None:
    schema = schemas[model.__name__]
    hints = typing.get_type_hints(model)
    fields = {camel(f.name): f for f in dataclasses.fields(model)}
    assert set(fields) == set(schema["properties"]), model.__name__
    required = set(schema.get("required", []))
    for name, f in fields.items():
        assert (name in required) == (not optional(hints[f.name])), f"{model.__name__}.{f.name}"


def test_request_bodies_use_only_fields_the_schemas_allow(schemas: Dict[str, Any]) -> None:
    def keys(schema: str) -> Set[str]:
        return set(schemas[schema]["properties"])

    sent = _calls.acquire("shop.example", {"a": "b"}, "eu", 30, "me").body
    assert sent is not None and set(sent) == keys("LeaseRequest")
    assert set(schemas["LeaseRequest"].get("required", [])) == {"target"}
    report = _calls.report("id", Outcome.BLOCKED, "captcha").body
    assert report is not None and set(report) == keys("LeaseReport")
    renew = _calls.renew("id", 60).body
    assert renew is not None and set(renew) == keys("RenewRequest")


def test_outcomes_are_the_servers(schemas: Dict[str, Any]) -> None:
    assert {o.value for o in Outcome} == set(schemas["ReportOutcome"]["enum"])


def test_error_codes_the_client_knows_are_documented(schemas: Dict[str, Any]) -> None:
    body = schemas["ErrorBody"]
    assert {"error", "message"} <= set(body["required"])
    documented = set(body["properties"]["error"]["enum"])
    # Those the client maps to a class of their own, and the 503s it retries as `Unavailable`.
    known = set(errors._BY_CODE) | {"unavailable", "not_leader", "lease_store_full"}
    assert known <= documented, known - documented
