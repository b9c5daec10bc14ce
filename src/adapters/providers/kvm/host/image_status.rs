//! The image cache as the dashboard shows it: what each KVM host has
//! fetched, is fetching (and how far), or failed to fetch.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock, Mutex};

use super::image_fetch::Progress;
use crate::adapters::providers::kvm::host_runner::RunError;
use crate::adapters::providers::kvm::image::{CachedBase, ImageSpec};
use serde::Serialize;

/// The image cache as the dashboard shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageInfo {
    pub host: String,
    pub url: String,
    /// `fetching`, `cached` or `failed`.
    pub state: String,
    pub volume: Option<String>,
    pub digest: Option<String>,
    pub error: Option<String>,
    /// Seconds since the fetch started (while fetching).
    pub fetching_for_secs: Option<u64>,
    /// Bytes read so far of the current read, and of how many (while fetching).
    pub bytes_done: Option<u64>,
    pub bytes_total: Option<u64>,
}

/// A fetch under way: since when, and how far.
type Fetching = (std::time::Instant, Arc<Progress>);

/// (host, URL) → where it stands.
type ImageTable = BTreeMap<(String, String), (ImageInfo, Option<Fetching>)>;

static IMAGES: LazyLock<Mutex<ImageTable>> = LazyLock::new(Mutex::default);

/// A fetch of `image` onto `host` started; `progress` says how far it is.
pub fn report_fetching(host: &str, image: &ImageSpec, progress: Arc<Progress>) {
    let info = ImageInfo {
        host: host.to_owned(),
        url: image.url.clone(),
        state: "fetching".into(),
        volume: image.configured_base(),
        digest: image.sha256.clone(),
        error: None,
        fetching_for_secs: None,
        bytes_done: None,
        bytes_total: None,
    };
    let mut images = IMAGES.lock().unwrap_or_else(|p| p.into_inner());
    images.insert(
        (info.host.clone(), info.url.clone()),
        (info, Some((std::time::Instant::now(), progress))),
    );
}

/// A fetch ended: the base it produced, or why it failed.
pub fn report_fetched(host: &str, url: &str, result: Result<&CachedBase, &RunError>) {
    let info = ImageInfo {
        host: host.to_owned(),
        url: url.to_owned(),
        state: if result.is_ok() { "cached" } else { "failed" }.into(),
        volume: result.ok().map(|b| b.volume.clone()),
        digest: result.ok().map(|b| b.digest.clone()),
        error: result.err().map(ToString::to_string),
        fetching_for_secs: None,
        bytes_done: None,
        bytes_total: None,
    };
    let mut images = IMAGES.lock().unwrap_or_else(|p| p.into_inner());
    images.insert((info.host.clone(), info.url.clone()), (info, None));
}

pub fn images() -> Vec<ImageInfo> {
    let images = IMAGES.lock().unwrap_or_else(|p| p.into_inner());
    images
        .values()
        .map(|(info, fetching)| ImageInfo {
            fetching_for_secs: fetching.as_ref().map(|(since, _)| since.elapsed().as_secs()),
            bytes_done: fetching.as_ref().map(|(_, p)| p.done.load(Ordering::Relaxed)),
            bytes_total: fetching
                .as_ref()
                .map(|(_, p)| p.total.load(Ordering::Relaxed))
                .filter(|t| *t > 0),
            ..info.clone()
        })
        .collect()
}
