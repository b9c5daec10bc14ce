//! The rate limits as middleware: ahead of authentication and logging, so a
//! flood costs one bucket lookup per request and no log line.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{Error, ResponseError};
use egress_proxies::rate_limit::{RateLimiter, RateLimits};

use super::errors::ApiError;

/// The buckets, shared by every worker.
#[derive(Clone)]
pub struct Limiter(Arc<Mutex<RateLimiter>>);

impl Limiter {
    pub fn new(limits: RateLimits) -> Self {
        Self(Arc::new(Mutex::new(RateLimiter::new(limits, Instant::now()))))
    }

    /// Client addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).tracked()
    }
}

pub async fn limit(
    limiter: Limiter,
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    // The peer address, never a forwarded-for header a client could forge.
    let client = req
        .peer_addr()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip());
    let verdict = limiter
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .check(client, Instant::now());
    if let Err(limited) = verdict {
        return Ok(req.into_response(ApiError::RateLimited(limited).error_response()));
    }
    next.call(req).await.map(ServiceResponse::map_into_boxed_body)
}
