//! API errors as JSON `{error, message}` with the right status.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use egress_proxies::domain::lease::TableFull;
use egress_proxies::rate_limit::{Limited, retry_after_secs};

use egress_proxies::adapters::discovery_api::bodies::ErrorBody;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    NoCapacity(String),
    #[error("{0}")]
    UnknownLease(String),
    #[error("{0}")]
    Invalid(String),
    #[error("a valid bearer token is required")]
    Unauthorized,
    #[error("this token may only read (list proxies, the dashboard); leases need the crawler token")]
    ReadOnlyToken,
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("no such endpoint")]
    NotFound,
    /// The lease could not be made durable: try again later (503).
    #[error("{0}")]
    Unavailable(String),
    #[error("this replica is not the leader; retry through the Service")]
    NotLeader,
    /// The path exists; the method does not (the methods it takes).
    #[error("method not allowed here; this path takes {0}")]
    MethodNotAllowed(&'static str),
    #[error("{0}")]
    RateLimited(Limited),
    #[error("{0}")]
    StoreFull(TableFull),
    #[error("{0}")]
    Internal(String),
    /// The lease's proxy is being retired by its pool: not renewed (409).
    #[error("{0}")]
    ProxyRetiring(String),
    /// The lease is another identity's, or the gateway's (403).
    #[error("{0}")]
    NotOwner(String),
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::NoCapacity(_) => "no_capacity",
            ApiError::UnknownLease(_) => "unknown_lease",
            ApiError::Invalid(_) => "invalid_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::ReadOnlyToken => "forbidden",
            ApiError::TooLarge(_) => "payload_too_large",
            ApiError::NotFound => "not_found",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::NotLeader => "not_leader",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::RateLimited(_) => "rate_limited",
            ApiError::StoreFull(_) => "lease_store_full",
            ApiError::Internal(_) => "internal",
            ApiError::ProxyRetiring(_) => "proxy_retiring",
            ApiError::NotOwner(_) => "not_owner",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::NoCapacity(_)
            | ApiError::Unavailable(_)
            | ApiError::NotLeader
            | ApiError::StoreFull(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::UnknownLease(_) | ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::ReadOnlyToken | ApiError::NotOwner(_) => StatusCode::FORBIDDEN,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::ProxyRetiring(_) => StatusCode::CONFLICT,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        match self {
            ApiError::Unauthorized => {
                response.insert_header(("WWW-Authenticate", "Bearer"));
            }
            ApiError::Unavailable(_) => {
                response.insert_header(("Retry-After", "1"));
            }
            ApiError::MethodNotAllowed(allow) => {
                response.insert_header(("Allow", *allow));
            }
            ApiError::RateLimited(limited) => {
                response.insert_header(("Retry-After", retry_after_secs(limited.retry_after).to_string()));
            }
            ApiError::StoreFull(full) => {
                response.insert_header(("Retry-After", retry_after_secs(full.retry_after).to_string()));
            }
            _ => {}
        }
        let mut response = response.json(ErrorBody {
            error: self.code().to_owned(),
            message: self.to_string(),
        });
        // For the access log, which sees only the response.
        response.extensions_mut().insert(ErrorCode(self.code()));
        response
    }
}

/// The `error` code an answer carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorCode(pub &'static str);

#[cfg(test)]
mod tests {
    use super::*;
    use egress_proxies::adapters::discovery_api::bodies::ERROR_CODES;

    #[test]
    fn every_code_the_server_sends_is_documented() {
        let every = [
            ApiError::NoCapacity(String::new()),
            ApiError::UnknownLease(String::new()),
            ApiError::Invalid(String::new()),
            ApiError::Unauthorized,
            ApiError::ReadOnlyToken,
            ApiError::TooLarge(0),
            ApiError::NotFound,
            ApiError::Unavailable(String::new()),
            ApiError::NotLeader,
            ApiError::MethodNotAllowed("GET"),
            ApiError::Internal(String::new()),
            ApiError::ProxyRetiring(String::new()),
            ApiError::NotOwner(String::new()),
        ];
        for error in &every {
            assert!(
                ERROR_CODES.contains(&error.code()),
                "{} is missing from ERROR_CODES",
                error.code()
            );
        }
        for code in ["rate_limited", "lease_store_full"] {
            assert!(ERROR_CODES.contains(&code));
        }
    }
}
