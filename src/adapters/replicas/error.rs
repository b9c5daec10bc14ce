//! What can go wrong between replicas, and between a replica and the
//! cluster's record of the members.

use std::time::Duration;

use crate::adapters::leader::ElectionError;

/// An error of the replicas part.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// A call on the member Leases failed.
    #[error("{call} of the member Leases failed: {source}")]
    MemberLeases {
        call: &'static str,
        #[source]
        source: kube::Error,
    },
    /// Renewing or releasing this replica's member Lease failed.
    #[error(transparent)]
    Election(#[from] ElectionError),
    /// This replica's member tenure ran out: it may hold no share and
    /// grant nothing, and must not come back under the same tag.
    #[error("this replica's member Lease {lease} lapsed: {why}")]
    Lapsed { lease: String, why: String },
    /// The internal listener would serve credentials off loopback without
    /// a token to check callers with.
    #[error(
        "the replica listener {address} is not on loopback and there is no discovery token to \
         derive the replicas' token from: set DISCOVERY_TOKEN or bind it to loopback"
    )]
    ExposedWithoutToken { address: String },
    /// Another replica could not be reached.
    #[error("replica {address}: {message}")]
    Unreachable { address: String, message: String },
    /// Another replica did not answer in time.
    #[error("replica {address} did not answer within {after:?}")]
    Timeout { address: String, after: Duration },
    /// Another replica refused the call (its status and error body).
    #[error("replica {address} answered {status}: {message}")]
    Refused {
        address: String,
        status: u16,
        message: String,
    },
    /// Another replica's answer could not be read.
    #[error("replica {address} answered something unreadable: {message}")]
    Unreadable { address: String, message: String },
    /// Another replica sent a value that does not parse.
    #[error("a replica sent an invalid {what}: {value}")]
    Malformed { what: &'static str, value: String },
}
