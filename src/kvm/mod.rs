//! The kvm provider's building blocks (contract: KVM.md): domain and volume
//! XML, the operator's metadata element, the NoCloud seed ISO, providerIDs
//! and libvirt error classification. Pure functions; the SSH link and the
//! libvirt calls live beside them.

pub mod base_image;
pub mod domain_xml;
pub mod errors;
pub mod image;
pub mod libvirt;
pub mod metadata;
pub mod ops;
pub mod pool_gc;
pub mod provider;
pub mod provider_id;
pub mod redial;
pub mod seed;
pub mod session;
pub mod ssh_key;
pub mod ssh_link;
pub mod volume_xml;
