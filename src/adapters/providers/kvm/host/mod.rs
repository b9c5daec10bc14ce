//! What runs on a KVM host's link, without the actors that drive it: the
//! SSH link and when to redial it, the libvirt thread and the session on
//! it, the requests that session serves (each a [`HostCall`] answered with
//! its own type) through the domain operations, image fetches and pool
//! sweeps, the image table the dashboard shows, and the provider's
//! `HostRunner` as typed calls on a [`HostRouter`].
//!
//! The running system's host actors (`egress_proxies_operator::kvm`) own a
//! link and a libvirt thread per host and queue calls on it; its image
//! cache actor runs fetches and reports them here; together they are the
//! [`HostRouter`]. The names re-exported below are the one surface they
//! use — the host side, and what else of the provider it takes — and
//! nothing deeper.

pub mod calls;
pub mod domain_ops;
pub mod image_fetch;
pub mod image_status;
pub mod libvirt_thread;
pub mod pool_sweep;
pub mod redial;
pub mod routed_runner;
pub mod session;
pub mod ssh_link;

pub use calls::{HostCall, LookupBase};
pub use image_fetch::{Downloader, Progress, fetch_to_pool};
pub use image_status::{ImageInfo, images, report_fetched, report_fetching};
pub use libvirt_thread::{Job, LibvirtThread, Waited};
pub use redial::Redial;
pub use routed_runner::{HostRouter, RoutedRunner};
pub use session::HostSession;
pub use ssh_link::{LinkError, LinkTarget, SshLink};

pub use super::host_runner::{HostRunner, RunError};
pub use super::image::{CachedBase, DownloadLimits, ImageSpec};
pub use super::libvirt::ensure_client_setup;
pub use super::ssh_key::load_private_key;
