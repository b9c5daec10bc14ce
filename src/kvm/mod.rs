//! The kvm provider's building blocks (contract: KVM.md): domain and volume
//! XML, the operator's metadata element, the NoCloud seed ISO, providerIDs
//! and libvirt error classification. Pure functions; the SSH link and the
//! libvirt calls live beside them.

pub mod libvirt;
pub mod seed;
pub mod ssh_key;
pub mod ssh_link;
