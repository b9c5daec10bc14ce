//! The kvm provider (contract: docs/kvm-internals.md) and its building
//! blocks: domain and volume XML, the operator's metadata element, the
//! NoCloud seed ISO, providerIDs, images and libvirt error classification,
//! the plans and answers of the operations — pure, all of it — and, in
//! [`host`], everything that runs on a host's link (the SSH link, its
//! redial, the libvirt session, the requests it serves, image fetches,
//! pool sweeps). The provider reaches its hosts through one port,
//! [`host_runner::HostRunner`], which the running system's host actors
//! (`egress_proxies_operator::kvm`) implement on top of [`host`].

pub mod base_image;
pub mod domain_xml;
pub mod errors;
pub mod host;
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
