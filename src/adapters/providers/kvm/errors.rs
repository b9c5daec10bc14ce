//! libvirt errors onto the provider taxonomy (docs/kvm-internals.md#errors):
//! "no such domain / volume / pool" is NotFound where something is looked up;
//! invalid XML or arguments and unsupported configurations are Permanent;
//! everything else the daemon reports (busy, internal, operation failed) and
//! every transport failure is Transient.

use virt::error::ErrorNumber;

use crate::domain::provider_contract::ErrorClass;

/// The class of a libvirt error number.
pub fn classify(code: ErrorNumber) -> ErrorClass {
    match code {
        ErrorNumber::NoDomain | ErrorNumber::NoStorageVolume | ErrorNumber::NoStoragePool => {
            ErrorClass::NotFound
        }
        ErrorNumber::InvalidArg
        | ErrorNumber::XmlError
        | ErrorNumber::NoSupport
        | ErrorNumber::ConfigUnsupported => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// A failed libvirt call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{rpc} {target}: {message}")]
pub struct KvmError {
    pub rpc: &'static str,
    pub target: String,
    pub code: Option<ErrorNumber>,
    pub message: String,
}

impl KvmError {
    pub fn class(&self) -> ErrorClass {
        self.code.map_or(ErrorClass::Transient, classify)
    }

    /// The connection to the daemon itself failed (not a daemon-reported
    /// error): the link should be re-established.
    pub fn is_transport(&self) -> bool {
        matches!(
            self.code,
            Some(ErrorNumber::Rpc | ErrorNumber::SystemError | ErrorNumber::NoConnect) | None
        )
    }

    pub fn is_not_found(&self) -> bool {
        self.class() == ErrorClass::NotFound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        for (code, want) in [
            (ErrorNumber::NoDomain, ErrorClass::NotFound),
            (ErrorNumber::NoStorageVolume, ErrorClass::NotFound),
            (ErrorNumber::NoStoragePool, ErrorClass::NotFound),
            (ErrorNumber::XmlError, ErrorClass::Permanent),
            (ErrorNumber::InvalidArg, ErrorClass::Permanent),
            (ErrorNumber::ConfigUnsupported, ErrorClass::Permanent),
            (ErrorNumber::InternalError, ErrorClass::Transient),
            (ErrorNumber::OperationFailed, ErrorClass::Transient),
            (ErrorNumber::SystemError, ErrorClass::Transient),
            (ErrorNumber::Rpc, ErrorClass::Transient),
        ] {
            assert_eq!(classify(code), want, "{code:?}");
        }
    }
}
