//! The OpenAPI document at `/v1/openapi.json`: generated from the
//! [operations](super::operations) and their [bodies](super::bodies), then given the bounds the server enforces (from
//! `domain::lease::input`, the same constants the handlers check),
//! the 405 and 429 answers every operation can give, and the links from a
//! granted lease to its renew, report and release.

use crate::domain::lease::input::{
    self, MAX_ATTRIBUTE_KEY_CHARS, MAX_ATTRIBUTE_VALUE_CHARS, MAX_CLIENT_CHARS, MAX_DETAIL_CHARS,
    MAX_SELECTOR_PAIRS, MAX_TARGET_LEN, MAX_TTL_SECONDS,
};
use serde_json::{Value, json};
use utoipa::OpenApi;

use super::{bodies, operations};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "egress-proxies-operator discovery API",
        description = "Lists the egress proxy fleet and hands proxies out to crawler clients as leases."
    ),
    paths(
        operations::list_proxies, operations::acquire, operations::release, operations::report, operations::renew,
        operations::healthz
    ),
    components(schemas(
        bodies::ProxyInfo, bodies::LeaseRequest, bodies::Lease, bodies::LeasedProxy,
        bodies::LeaseReport, bodies::ReportOutcome, bodies::RenewRequest, bodies::Renewal, bodies::ErrorBody
    )),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Merges `patch` into the object at `pointer` (which must exist: a missing
/// one is a bug in this file, caught by the document's tests).
fn merge(doc: &mut Value, pointer: &str, patch: Value) {
    if let (Some(Value::Object(target)), Value::Object(patch)) = (doc.pointer_mut(pointer), patch) {
        target.extend(patch);
    } else {
        tracing::error!(pointer, "OpenAPI document: nothing to patch at this pointer");
    }
}

fn string_map(max_properties: usize) -> Value {
    json!({
        "type": "object",
        "maxProperties": max_properties,
        "propertyNames": {"minLength": 1, "maxLength": MAX_ATTRIBUTE_KEY_CHARS},
        "additionalProperties": {"type": "string", "maxLength": MAX_ATTRIBUTE_VALUE_CHARS},
    })
}

fn ttl(nullable: bool) -> Value {
    let kind = if nullable {
        json!(["integer", "null"])
    } else {
        json!("integer")
    };
    json!({"type": kind, "format": "int64", "minimum": 1, "maximum": MAX_TTL_SECONDS})
}

/// The document as the server enforces it.
pub fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|e| json!({"error": e.to_string()}));
    let schemas = "/components/schemas";
    merge(
        &mut doc,
        &format!("{schemas}/LeaseRequest/properties/target"),
        json!({"minLength": 1, "maxLength": MAX_TARGET_LEN, "pattern": input::target_pattern()}),
    );
    merge(
        &mut doc,
        &format!("{schemas}/LeaseRequest/properties/selector"),
        string_map(MAX_SELECTOR_PAIRS),
    );
    merge(
        &mut doc,
        &format!("{schemas}/LeaseRequest/properties/ttlSeconds"),
        ttl(true),
    );
    merge(
        &mut doc,
        &format!("{schemas}/LeaseRequest/properties/pool"),
        json!({"minLength": 1, "maxLength": input::MAX_POOL_LEN, "pattern": input::POOL_PATTERN}),
    );
    merge(
        &mut doc,
        &format!("{schemas}/LeaseRequest/properties/client"),
        json!({"maxLength": MAX_CLIENT_CHARS}),
    );
    merge(
        &mut doc,
        &format!("{schemas}/LeaseReport/properties/detail"),
        json!({"maxLength": MAX_DETAIL_CHARS}),
    );
    merge(
        &mut doc,
        &format!("{schemas}/RenewRequest/properties/ttlSeconds"),
        ttl(true),
    );
    for name in ["LeaseRequest", "LeaseReport", "RenewRequest"] {
        merge(
            &mut doc,
            &format!("{schemas}/{name}"),
            json!({"additionalProperties": false}),
        );
    }
    merge(
        &mut doc,
        "/paths/~1v1~1proxies/get/parameters/0/schema",
        json!({"maxItems": MAX_SELECTOR_PAIRS, "items": {"type": "string", "pattern": input::attr_filter_pattern()}}),
    );
    merge(
        &mut doc,
        "/paths/~1v1~1leases~1{id}~1renew/post/requestBody",
        json!({"required": false}),
    );
    merge(
        &mut doc,
        &format!("{schemas}/ErrorBody/properties/error"),
        json!({"enum": bodies::ERROR_CODES}),
    );
    for path in [
        "/v1/leases/{id}",
        "/v1/leases/{id}/report",
        "/v1/leases/{id}/renew",
    ] {
        let escaped = path.replace('/', "~1");
        let method = if path == "/v1/leases/{id}" {
            "delete"
        } else {
            "post"
        };
        merge(
            &mut doc,
            &format!("/paths/{escaped}/{method}/parameters/0/schema"),
            json!({"minLength": 1}),
        );
    }

    // Every operation: 405 for another method on its path; 429 from the rate
    // limits (all but /healthz, which is never limited).
    let error = json!({"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}});
    let retry_after = json!({"Retry-After": {
        "description": "Seconds to wait before trying again",
        "schema": {"type": "integer", "minimum": 1}
    }});
    if let Some(Value::Object(paths)) = doc.get_mut("paths") {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            let methods: Vec<String> = item.keys().map(|m| m.to_uppercase()).collect();
            for op in item.values_mut() {
                let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
                    continue;
                };
                responses.insert(
                    "405".into(),
                    json!({
                        "description": format!("Wrong method for this path; `Allow` lists the right one ({})", methods.join(", ")),
                        "headers": {"Allow": {"description": "The methods this path takes", "schema": {"type": "string"}}},
                        "content": error,
                    }),
                );
                if path != "/healthz" {
                    responses.insert(
                        "429".into(),
                        json!({
                            "description": "Over a rate limit (`rate_limited`); retry after `Retry-After` seconds",
                            "headers": retry_after,
                            "content": error,
                        }),
                    );
                }
                if let Some(Value::Object(full)) = responses.get_mut("503") {
                    full.insert("headers".into(), retry_after.clone());
                }
            }
        }
    }
    // A granted lease's id feeds its renew, report and release (stateful fuzzing follows these).
    let id = json!({"parameters": {"id": "$response.body#/id"}});
    merge(
        &mut doc,
        "/paths/~1v1~1leases/post/responses/201",
        json!({"links": {
            "RenewLease": {"operationId": "renew", "parameters": id["parameters"]},
            "ReportLease": {"operationId": "report", "parameters": id["parameters"]},
            "ReleaseLease": {"operationId": "release", "parameters": id["parameters"]},
        }}),
    );
    doc
}

/// The OpenAPI document as JSON.
pub fn openapi_json() -> String {
    serde_json::to_string_pretty(&document()).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}
