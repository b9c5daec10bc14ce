//! The kvm provider (contract: docs/kvm-internals.md) and its building
//! blocks: domain and volume XML, the operator's metadata element, the
//! NoCloud seed ISO, providerIDs, images and libvirt error classification,
//! the plans and answers of the operations — pure, all of it. Everything
//! that runs on a host's link (the SSH link, its redial, the libvirt
//! session, the requests it serves, image fetches, pool sweeps) lives with
//! the host actors in `egress_proxies_operator::kvm`; the provider reaches
//! it through one port, [`host_runner::HostRunner`].

pub mod base_image;
pub mod domain_xml;
pub mod errors;
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
pub mod seed;
pub mod ssh_key;
pub mod volume_xml;
