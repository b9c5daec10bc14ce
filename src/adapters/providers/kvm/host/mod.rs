//! What runs on a KVM host's link, without the actors that drive it: the
//! SSH link and when to redial it, the libvirt thread and the session on
//! it, the requests that session serves (each a [`HostCall`] answered with
//! its own type) through the domain operations, image fetches and pool
//! sweeps, and the image table the dashboard shows.
//!
//! The running system's host actors own a link and a libvirt thread per
//! host and queue calls on it; the image cache actor runs fetches and
//! reports them here; together they are the [`HostRouter`] that
//! [`RoutedRunner`] makes the provider's `HostRunner` of. They use the names re-exported below — this
//! module's public surface — and nothing deeper.

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

pub use calls::{
    CreateDomain, DeleteDomain, GetDomain, HostCall, ListManaged, LookupBase, ReleaseDomain, SweepPool,
};
pub use image_fetch::{Downloader, Progress, fetch_to_pool};
pub use image_status::{ImageInfo, images, report_fetched, report_fetching};
pub use libvirt_thread::{Job, LibvirtThread, Waited};
pub use redial::Redial;
pub use routed_runner::{HostRouter, RoutedRunner};
pub use session::HostSession;
pub use ssh_link::{LinkError, LinkTarget, SshLink};
