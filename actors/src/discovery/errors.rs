//! API errors as JSON `{error, message}` with the right status.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use super::types::ErrorBody;

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
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("no such endpoint")]
    NotFound,
    /// The lease could not be made durable: try again later (503).
    #[error("{0}")]
    Unavailable(String),
    #[error("this replica is not the leader; retry through the Service")]
    NotLeader,
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::NoCapacity(_) => "no_capacity",
            ApiError::UnknownLease(_) => "unknown_lease",
            ApiError::Invalid(_) => "invalid_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::TooLarge(_) => "payload_too_large",
            ApiError::NotFound => "not_found",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::NotLeader => "not_leader",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::NoCapacity(_) | ApiError::Unavailable(_) | ApiError::NotLeader => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::UnknownLease(_) | ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
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
            _ => {}
        }
        response.json(ErrorBody {
            error: self.code().to_owned(),
            message: self.to_string(),
        })
    }
}
