//! The discovery API's contract, as crawler clients see it: its routes,
//! its JSON bodies and error codes, its operations and the OpenAPI document
//! built from them. `actors/src/discovery/` serves it with actix-web; a
//! client, a test or the fuzzer reads it from here.

pub mod bodies;
pub mod openapi;
pub mod operations;
pub mod routes;

pub use openapi::openapi_json;
