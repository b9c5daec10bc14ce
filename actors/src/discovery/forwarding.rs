//! Lease calls for a lease another replica holds (every replica serving):
//! passed to that replica on the internal listener, its answer relayed as
//! it is. Where a call goes is `LeaseRoutes`' decision.

use actix_web::HttpResponse;
use egress_proxies::adapters::replicas::client::ReplicaClient;
use egress_proxies::adapters::replicas::routes::{LeaseRoutes, Route};
use egress_proxies::adapters::replicas::wire::{ForwardedLeaseCall, LeaseCall};

use super::errors::ApiError;

/// A replica's forwarding of lease calls.
#[derive(Clone)]
pub struct Forwarding {
    pub routes: LeaseRoutes,
    pub client: ReplicaClient,
}

impl Forwarding {
    /// The answer of the replica holding lease `id`, when another one
    /// does; `None`: this replica serves the call. `forwarded`: the call
    /// came from another replica (it goes on at most once more).
    pub async fn elsewhere(
        &self,
        id: &str,
        caller: &str,
        call: LeaseCall,
        forwarded: bool,
    ) -> Result<Option<HttpResponse>, ApiError> {
        let route = if forwarded {
            self.routes.route_forwarded(id)
        } else {
            self.routes.route(id)
        };
        let address = match route {
            Route::Here => return Ok(None),
            Route::NotYet => {
                return Err(ApiError::Unavailable(
                    "the replica that granted this lease is gone and the leader has not taken its leases over yet"
                        .to_owned(),
                ));
            }
            Route::There(address) => address,
        };
        let forwarded = ForwardedLeaseCall {
            caller: caller.to_owned(),
            call,
        };
        let answer = self.client.forward(&address, id, &forwarded).await.map_err(|e| {
            ApiError::Unavailable(format!("the replica holding this lease did not answer: {e}"))
        })?;
        let status = actix_web::http::StatusCode::from_u16(answer.status)
            .unwrap_or(actix_web::http::StatusCode::BAD_GATEWAY);
        let mut response = HttpResponse::build(status);
        if let Some(retry) = answer.retry_after {
            response.insert_header((actix_web::http::header::RETRY_AFTER, retry));
        }
        if let Some(content_type) = answer.content_type {
            response.content_type(content_type);
        }
        Ok(Some(response.body(answer.body)))
    }
}
