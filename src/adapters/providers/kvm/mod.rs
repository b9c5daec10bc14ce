//! The kvm provider's building blocks (contract: docs/kvm-internals.md):
//! domain and volume XML, the operator's metadata element, the NoCloud seed
//! ISO, providerIDs and libvirt error classification. Pure functions; the SSH
//! link and the libvirt calls live beside them, as do the requests a host's
//! libvirt session serves ([`host_calls`], each with its own answer type) and
//! the [`host_runner::HostRunner`] through which the provider sends them (the
//! host actors implement it; nothing here imports actix).

pub mod base_image;
pub mod domain_xml;
pub mod errors;
pub mod host_calls;
pub mod host_runner;
pub mod image;
pub mod image_url;
pub mod libvirt;
pub mod metadata;
pub mod ops;
pub mod placement_image;
pub mod pool_gc;
pub mod provider;
pub mod provider_id;
pub mod qcow2_header;
pub mod redial;
pub mod seed;
pub mod session;
pub mod ssh_key;
pub mod ssh_link;
pub mod volume_xml;
