//! Blocking libvirt calls on one host, over one connection. Every call is
//! logged at debug with the libvirt API name, the identifiers, the duration
//! and — on failure — libvirt's error code name; XML goes to trace level.
//! Callers run these off the async executor (a host actor's own thread).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use virt::connect::Connect;
use virt::domain::Domain;
use virt::error::ErrorNumber;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use crate::adapters::providers::kvm::errors::KvmError;
use crate::adapters::providers::kvm::metadata::{self, InstanceMetadata, METADATA_PREFIX, METADATA_URI};
use crate::adapters::providers::kvm::ops::{DomainRunState, VolumeInfo};

/// libvirt's reason for a shut-off or crashed domain, as a sentence.
fn stop_reason(reason: &virt::domain::DomainStateReasonEnum) -> &'static str {
    use virt::domain::{DomainCrashedReason as C, DomainShutoffReason as S, DomainStateReason as R};
    use virt::enumutil::Enum::Known as K;
    match reason {
        K(R::Shutoff(K(S::Shutdown))) => "domain shut off: the guest shut itself down",
        K(R::Shutoff(K(S::Destroyed))) => "domain shut off: destroyed (forced off from outside the guest)",
        K(R::Shutoff(K(S::Crashed))) => "domain shut off: the guest crashed",
        K(R::Shutoff(K(S::Migrated))) => "domain shut off: migrated to another host",
        K(R::Shutoff(K(S::Saved))) => "domain shut off: its state was saved",
        K(R::Shutoff(K(S::Failed))) => "domain shut off: it failed to start",
        K(R::Shutoff(K(S::FromSnapshot))) => "domain shut off: restored from a snapshot",
        K(R::Shutoff(K(S::Daemon))) => "domain shut off: libvirtd found its QEMU process gone",
        K(R::Crashed(K(C::Panicked))) => "domain crashed: the guest kernel panicked",
        K(R::Crashed(_)) => "domain crashed",
        _ => "domain shut off (libvirt gives no reason)",
    }
}

/// `<backingStore><path>` of a volume's XML.
fn backing_path(xml: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    let store = doc
        .root_element()
        .children()
        .find(|n| n.has_tag_name("backingStore"))?;
    let path = store.children().find(|n| n.has_tag_name("path"))?.text()?.trim();
    (!path.is_empty()).then(|| path.to_owned())
}

/// The disk paths in a domain's XML: `<source file|dev>` of every disk and
/// of its `<backingStore>` chain; `<source pool volume>` as `pool/volume`.
fn disk_sources(xml: &str) -> Vec<String> {
    let Ok(doc) = roxmltree::Document::parse(xml) else {
        return Vec::new();
    };
    doc.descendants()
        .filter(|n| n.has_tag_name("source"))
        .filter(|n| {
            n.parent()
                .is_some_and(|p| p.has_tag_name("disk") || p.has_tag_name("backingStore"))
        })
        .filter_map(|n| match (n.attribute("pool"), n.attribute("volume")) {
            (Some(pool), Some(volume)) => Some(format!("{pool}/{volume}")),
            _ => n
                .attribute("file")
                .or_else(|| n.attribute("dev"))
                .map(str::to_owned),
        })
        .collect()
}

/// The pool types whose volumes are files named `<target path>/<volume
/// name>` (libvirt's filesystem backends define them so).
const FILE_POOL_TYPES: [&str; 3] = ["dir", "fs", "netfs"];

/// The directory of a file-backed pool (`<target><path>` of its XML).
fn pool_directory(xml: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    let root = doc.root_element();
    if !FILE_POOL_TYPES.contains(&root.attribute("type")?) {
        return None;
    }
    let target = root.children().find(|n| n.has_tag_name("target"))?;
    let path = target.children().find(|n| n.has_tag_name("path"))?.text()?.trim();
    path.starts_with('/')
        .then(|| path.trim_end_matches('/').to_owned())
}

/// Most domain marks a session remembers; beyond it they are read afresh.
const MAX_REMEMBERED_MARKS: usize = 4096;

/// One libvirt connection to a host's daemon and its storage pool.
pub struct HostSession {
    conn: Connect,
    host: String,
    pool: String,
    /// The pool's handle, looked up once per session (every volume
    /// operation needs it); forgotten when libvirt no longer knows it.
    pool_handle: Mutex<Option<StoragePool>>,
    /// The pool's directory when its volumes are files (`None` inside: it
    /// is not such a pool), read once per session: a new volume's path is
    /// known without asking for it.
    pool_directory: Mutex<Option<Option<String>>>,
    /// Complete marks (managed, naming an installation) read or written so
    /// far, by domain UUID: such a mark is written with the domain's
    /// definition and changed only by a release, which forgets it here, so
    /// instance reads need not fetch it again. A domain defined anew has a
    /// new UUID; a mark an admin is still to complete by hand (adoption) is
    /// read afresh every time; orphan GC always reads marks afresh.
    marks: Mutex<HashMap<[u8; 16], InstanceMetadata>>,
}

impl HostSession {
    /// Opens `uri` (the SSH link's local socket) for `host`, using `pool`.
    pub fn open(uri: &str, host: &str, pool: &str) -> Result<Self, KvmError> {
        let started = Instant::now();
        let conn = Connect::open(Some(uri)).map_err(|e| error("virConnectOpen", host, e))?;
        tracing::debug!(
            rpc = "virConnectOpen",
            host,
            durationMs = started.elapsed().as_millis() as u64,
            "libvirt call"
        );
        Ok(Self {
            conn,
            host: host.to_owned(),
            pool: pool.to_owned(),
            pool_handle: Mutex::new(None),
            pool_directory: Mutex::new(None),
            marks: Mutex::new(HashMap::new()),
        })
    }

    /// The host's configured name (for logs).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The storage pool this session uses.
    pub fn pool(&self) -> &str {
        &self.pool
    }

    fn call<T>(
        &self,
        rpc: &'static str,
        target: &str,
        f: impl FnOnce() -> Result<T, virt::error::Error>,
    ) -> Result<T, KvmError> {
        let started = Instant::now();
        let result = f();
        crate::telemetry::events::LibvirtCallCompleted {
            rpc,
            duration: started.elapsed(),
        }
        .emit();
        let ms = started.elapsed().as_millis() as u64;
        match result {
            Ok(v) => {
                tracing::debug!(rpc, host = %self.host, target, durationMs = ms, "libvirt call");
                Ok(v)
            }
            Err(e) => {
                let err = error(rpc, target, e);
                if err.code == Some(ErrorNumber::NoStoragePool) {
                    // Undefined (and maybe defined anew): look it up again next time.
                    *self.pool_handle.lock().unwrap_or_else(PoisonError::into_inner) = None;
                }
                tracing::debug!(rpc, host = %self.host, target, durationMs = ms, code = ?err.code, error = %err.message, "libvirt call failed");
                Err(err)
            }
        }
    }

    fn storage_pool(&self) -> Result<StoragePool, KvmError> {
        let mut cached = self.pool_handle.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pool) = cached.as_ref() {
            return Ok(pool.clone());
        }
        let pool = self.call("virStoragePoolLookupByName", &self.pool, || {
            self.conn.lookup_storage_pool_by_name(&self.pool)
        })?;
        *cached = Some(pool.clone());
        Ok(pool)
    }

    fn volume(&self, name: &str) -> Result<StorageVol, KvmError> {
        let pool = self.storage_pool()?;
        self.call("virStorageVolLookupByName", name, || {
            pool.lookup_storage_vol_by_name(name)
        })
    }

    /// The path of a volume, `None` when it does not exist.
    pub fn volume_path(&self, name: &str) -> Result<Option<String>, KvmError> {
        match self.volume(name) {
            Ok(vol) => self.call("virStorageVolGetPath", name, || vol.path()).map(Some),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates a volume from XML (an existing one of that name is reused); returns its path.
    pub fn create_volume(&self, name: &str, xml: &str) -> Result<String, KvmError> {
        if let Some(path) = self.volume_path(name)? {
            return Ok(path);
        }
        let vol = self.create_volume_from(name, xml)?;
        self.path_of(name, &vol)
    }

    /// Creates a volume from XML; fails with `StorageVolExist` when one of
    /// that name is there. Nothing else is asked.
    pub fn create_volume_from(&self, name: &str, xml: &str) -> Result<StorageVol, KvmError> {
        tracing::trace!(host = %self.host, volume = name, xml, "volume XML");
        let pool = self.storage_pool()?;
        self.call("virStorageVolCreateXML", name, || {
            StorageVol::create_xml(&pool, xml, 0)
        })
    }

    /// Where a volume of this pool is (or would be): its file in a
    /// file-backed pool, known without a call; otherwise libvirt's answer
    /// for the existing volume (a not-found error when there is none).
    pub fn path_in_pool(&self, name: &str) -> Result<String, KvmError> {
        match self.directory()? {
            Some(dir) => Ok(format!("{dir}/{name}")),
            None => {
                let vol = self.volume(name)?;
                self.call("virStorageVolGetPath", name, || vol.path())
            }
        }
    }

    /// [`Self::path_in_pool`] of a volume in hand.
    pub fn path_of(&self, name: &str, vol: &StorageVol) -> Result<String, KvmError> {
        match self.directory()? {
            Some(dir) => Ok(format!("{dir}/{name}")),
            None => self.call("virStorageVolGetPath", name, || vol.path()),
        }
    }

    fn directory(&self) -> Result<Option<String>, KvmError> {
        let mut cached = self.pool_directory.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(dir) = cached.as_ref() {
            return Ok(dir.clone());
        }
        let pool = self.storage_pool()?;
        let xml = self.call("virStoragePoolGetXMLDesc", &self.pool, || pool.xml_desc(0))?;
        let dir = pool_directory(&xml);
        *cached = Some(dir.clone());
        Ok(dir)
    }

    /// Writes `bytes` into an existing volume (seed ISOs and small images).
    pub fn upload(&self, name: &str, bytes: &[u8]) -> Result<(), KvmError> {
        let vol = self.volume(name)?;
        self.upload_to(&vol, name, bytes)
    }

    /// [`Self::upload`] into a volume already in hand.
    pub fn upload_to(&self, vol: &StorageVol, name: &str, bytes: &[u8]) -> Result<(), KvmError> {
        let stream = self.call("virStreamNew", name, || Stream::new(&self.conn, 0))?;
        self.call("virStorageVolUpload", name, || {
            vol.upload(&stream, 0, bytes.len() as u64, 0)
        })?;
        let mut sent = 0;
        while sent < bytes.len() {
            let n = self.call("virStreamSend", name, || stream.send(&bytes[sent..]))?;
            sent += usize::try_from(n).unwrap_or(0).max(1);
        }
        self.call("virStreamFinish", name, || stream.finish())
    }

    /// Creates a raw volume of `len` bytes and streams `chunks` into it (image
    /// downloads: never buffered whole, never staged on the operator's disk).
    /// A channel that ends early aborts the upload and deletes the volume.
    pub fn upload_stream(
        &self,
        name: &str,
        len: u64,
        chunks: impl Iterator<Item = Vec<u8>>,
    ) -> Result<u64, KvmError> {
        self.delete_volume(name)?;
        let vol = self.create_volume_from(
            name,
            &crate::adapters::providers::kvm::volume_xml::plain_volume_xml(name, "raw", len),
        )?;
        let stream = self.call("virStreamNew", name, || Stream::new(&self.conn, 0))?;
        self.call("virStorageVolUpload", name, || vol.upload(&stream, 0, len, 0))?;
        let mut sent: u64 = 0;
        for chunk in chunks {
            let mut offset = 0;
            while offset < chunk.len() {
                let n = self.call("virStreamSend", name, || stream.send(&chunk[offset..]))?;
                offset += usize::try_from(n).unwrap_or(0).max(1);
            }
            sent += chunk.len() as u64;
        }
        if sent != len {
            let _ = stream.abort();
            let _ = self.delete_volume(name);
            return Err(KvmError {
                rpc: "virStreamSend",
                target: name.to_owned(),
                code: None,
                message: format!("download ended after {sent} of {len} bytes"),
            });
        }
        self.call("virStreamFinish", name, || stream.finish())?;
        Ok(sent)
    }

    /// The content of a small volume (a digest marker); `None` when missing.
    pub fn read_small(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, KvmError> {
        let vol = match self.volume(name) {
            Ok(v) => v,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let stream = self.call("virStreamNew", name, || Stream::new(&self.conn, 0))?;
        self.call("virStorageVolDownload", name, || vol.download(&stream, 0, max, 0))?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 4096];
        loop {
            let n = self.call("virStreamRecv", name, || stream.recv(&mut buf))?;
            if n <= 0 {
                break;
            }
            out.extend_from_slice(&buf[..n as usize]);
            if out.len() as u64 >= max {
                break;
            }
        }
        let _ = stream.finish();
        Ok(Some(out))
    }

    /// Deletes a volume by name; a missing volume (or pool) is fine.
    pub fn delete_volume(&self, name: &str) -> Result<(), KvmError> {
        match self.volume(name) {
            Ok(vol) => self.call("virStorageVolDelete", name, || vol.delete(0)),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every volume in the pool with its path and backing file (overlays).
    pub fn volumes(&self) -> Result<Vec<VolumeInfo>, KvmError> {
        let pool = self.storage_pool()?;
        let vols = self.call("virStoragePoolListAllVolumes", &self.pool, || {
            pool.list_all_volumes(0)
        })?;
        let mut out = Vec::with_capacity(vols.len());
        for vol in vols {
            // A volume deleted meanwhile is simply not listed.
            let (Ok(name), Ok(path)) = (vol.name(), vol.path()) else {
                continue;
            };
            let Ok(xml) = self.call("virStorageVolGetXMLDesc", &name, || vol.xml_desc(0)) else {
                continue;
            };
            tracing::trace!(host = %self.host, volume = %name, xml, "volume XML");
            out.push(VolumeInfo {
                backing: backing_path(&xml),
                name,
                path,
            });
        }
        Ok(out)
    }

    /// Names of all domains on the host, the operator's or not.
    pub fn domain_names(&self) -> Result<Vec<String>, KvmError> {
        let domains = self.call("virConnectListAllDomains", &self.host, || {
            self.conn.list_all_domains(0)
        })?;
        Ok(domains.iter().filter_map(|d| d.name().ok()).collect())
    }

    /// Free bytes in the pool (a full pool is reported before create as
    /// QuotaExceeded). No refresh first: libvirt refuses one while any upload
    /// runs in the pool, and keeps the figure current for its own volumes.
    pub fn pool_available_bytes(&self) -> Result<u64, KvmError> {
        let pool = self.storage_pool()?;
        self.call("virStoragePoolGetInfo", &self.pool, || pool.info())
            .map(|i| i.available)
    }

    /// The domain's handle; `None` when it does not exist.
    pub fn domain(&self, name: &str) -> Result<Option<Domain>, KvmError> {
        match self.call("virDomainLookupByName", name, || {
            self.conn.lookup_domain_by_name(name)
        }) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Starts a defined domain unless it runs.
    pub fn start(&self, domain: &Domain, name: &str) -> Result<(), KvmError> {
        if !self.call("virDomainIsActive", name, || domain.is_active())? {
            self.call("virDomainCreate", name, || domain.create())?;
        }
        Ok(())
    }

    /// Defines a domain the caller knows is not there, carrying `mark` in
    /// its XML, and starts it.
    pub fn define_and_start_new(
        &self,
        name: &str,
        xml: &str,
        mark: &InstanceMetadata,
    ) -> Result<(), KvmError> {
        tracing::trace!(host = %self.host, domain = name, xml, "domain XML");
        let domain = self.call("virDomainDefineXML", name, || self.conn.define_domain_xml(xml))?;
        self.remember_mark(&domain, mark);
        self.call("virDomainCreate", name, || domain.create())?;
        Ok(())
    }

    /// Defines the domain from XML (unless it exists — then `xml` is not
    /// used) and starts it (unless running).
    pub fn define_and_start(&self, name: &str, xml: &str) -> Result<(), KvmError> {
        let domain = match self.domain(name)? {
            Some(d) => d,
            None => {
                tracing::trace!(host = %self.host, domain = name, xml, "domain XML");
                self.call("virDomainDefineXML", name, || self.conn.define_domain_xml(xml))?
            }
        };
        self.start(&domain, name)
    }

    /// State and operator metadata of a domain; `None` when it does not exist.
    pub fn domain_state(
        &self,
        name: &str,
    ) -> Result<Option<(DomainRunState, Option<InstanceMetadata>)>, KvmError> {
        let Some(domain) = self.domain(name)? else {
            return Ok(None);
        };
        self.state_of(&domain, name).map(Some)
    }

    /// State and operator metadata of a domain in hand (the mark from
    /// memory when this session read it before).
    pub fn state_of(
        &self,
        domain: &Domain,
        name: &str,
    ) -> Result<(DomainRunState, Option<InstanceMetadata>), KvmError> {
        Ok((self.run_state(domain, name)?, self.remembered_mark(domain, name)?))
    }

    fn run_state(&self, domain: &Domain, name: &str) -> Result<DomainRunState, KvmError> {
        let (state, reason) = self.call("virDomainGetState", name, || domain.state())?;
        let run = match state {
            virt::domain::DomainStateEnum::Known(virt::domain::DomainState::Running) => {
                DomainRunState::Running
            }
            virt::domain::DomainStateEnum::Known(
                virt::domain::DomainState::Shutoff | virt::domain::DomainState::Crashed,
            ) => DomainRunState::Stopped {
                reason: stop_reason(&reason),
            },
            _ => DomainRunState::Transitional,
        };
        Ok(run)
    }

    /// [`Self::metadata_of`], from memory when this session read it before.
    fn remembered_mark(&self, domain: &Domain, name: &str) -> Result<Option<InstanceMetadata>, KvmError> {
        // The UUID is part of the handle: reading it is no call to the daemon.
        let Ok(uuid) = domain.uuid().map(|u| u.into_bytes()) else {
            return self.metadata_of(domain, name);
        };
        if let Some(mark) = self
            .marks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&uuid)
        {
            return Ok(Some(mark.clone()));
        }
        let mark = self.metadata_of(domain, name)?;
        if let Some(mark) = &mark {
            self.remember_mark(domain, mark);
        }
        Ok(mark)
    }

    fn remember_mark(&self, domain: &Domain, mark: &InstanceMetadata) {
        let complete = mark.managed && !mark.released && mark.installation.is_some();
        let Some(uuid) = domain.uuid().ok().filter(|_| complete) else {
            return;
        };
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        if marks.len() >= MAX_REMEMBERED_MARKS {
            marks.clear();
        }
        marks.insert(uuid.into_bytes(), mark.clone());
    }

    fn forget_mark(&self, domain: &Domain) {
        if let Ok(uuid) = domain.uuid() {
            self.marks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&uuid.into_bytes());
        }
    }

    fn metadata_of(&self, domain: &Domain, name: &str) -> Result<Option<InstanceMetadata>, KvmError> {
        let kind = virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32;
        match self.call("virDomainGetMetadata", name, || {
            domain.metadata(kind, Some(METADATA_URI), 0)
        }) {
            Ok(xml) => {
                tracing::trace!(host = %self.host, domain = name, xml, "domain metadata");
                Ok(metadata::parse(&xml))
            }
            // "metadata not found": not one of ours.
            Err(e) if e.code == Some(ErrorNumber::NoDomainMetadata) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The operator's mark on a domain and whether the domain exists; `None` without a mark.
    pub fn domain_metadata(&self, name: &str) -> Result<Option<Option<InstanceMetadata>>, KvmError> {
        match self.domain(name)? {
            Some(domain) => self.metadata_of(&domain, name).map(Some),
            None => Ok(None),
        }
    }

    /// Rewrites the operator's mark on a domain, in its persistent
    /// definition and, while it runs, in the live one too (so it survives a
    /// restart and is seen at once). False when the domain does not exist.
    pub fn set_metadata(&self, name: &str, meta: &InstanceMetadata) -> Result<bool, KvmError> {
        let Some(domain) = self.domain(name)? else {
            return Ok(false);
        };
        let xml = metadata::to_xml(meta);
        tracing::trace!(host = %self.host, domain = name, xml, "new domain metadata");
        let kind = virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32;
        let persistent = self.call("virDomainIsPersistent", name, || domain.is_persistent())?;
        let active = self.call("virDomainIsActive", name, || domain.is_active())?;
        let config = if persistent {
            virt::sys::VIR_DOMAIN_AFFECT_CONFIG
        } else {
            0
        };
        let live = if active {
            virt::sys::VIR_DOMAIN_AFFECT_LIVE
        } else {
            0
        };
        let set = |flags: u32| {
            self.call("virDomainSetMetadata", name, || {
                domain.set_metadata(kind, Some(&xml), Some(METADATA_PREFIX), Some(METADATA_URI), flags)
            })
        };
        // Whatever the outcome, the next read asks the daemon.
        self.forget_mark(&domain);
        match set(config | live) {
            Ok(()) => Ok(true),
            // It stopped between the two calls: its definition is all there is left.
            Err(e) if live != 0 && config != 0 && e.code == Some(ErrorNumber::OperationInvalid) => {
                set(config).map(|()| true)
            }
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every path a domain on the host uses for a disk — any domain, the
    /// operator's or not, running or only defined: its sources and, where
    /// libvirt reports them, their backing files, in the live and the
    /// persistent definition. Disks given as pool volumes are returned as
    /// `pool/volume`. A domain removed meanwhile is skipped.
    pub fn domain_disk_paths(&self) -> Result<HashSet<String>, KvmError> {
        let domains = self.call("virConnectListAllDomains", &self.host, || {
            self.conn.list_all_domains(0)
        })?;
        let mut out = HashSet::new();
        for domain in domains {
            let Ok(name) = domain.name() else { continue };
            for flags in [0, virt::sys::VIR_DOMAIN_XML_INACTIVE] {
                match self.call("virDomainGetXMLDesc", &name, || domain.xml_desc(flags)) {
                    Ok(xml) => out.extend(disk_sources(&xml)),
                    Err(e) if e.is_not_found() => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(out)
    }

    /// First routable IPv4 address: from the ARP table, else from the guest
    /// agent. Errors of either source mean "no address yet".
    pub fn address_of(&self, domain: &Domain, name: &str) -> Result<Option<IpAddr>, KvmError> {
        for source in [
            virt::sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
            virt::sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
        ] {
            let Ok(interfaces) = self.call("virDomainInterfaceAddresses", name, || {
                domain.interface_addresses(source, 0)
            }) else {
                continue;
            };
            let found = interfaces
                .iter()
                .flat_map(|i| i.addrs.iter())
                .filter_map(|a| a.addr.parse::<IpAddr>().ok())
                .find(|ip| matches!(ip, IpAddr::V4(v4) if !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified()));
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// Destroys (if running) and undefines the domain with everything libvirt
    /// keeps for it — NVRAM, managed save, snapshot and checkpoint metadata —
    /// since any of them left makes libvirt refuse the undefine (a snapshot an
    /// admin took would pin the delete for ever); a missing domain is fine.
    /// The checkpoint flag needs libvirt 5.6 or newer on the host.
    pub fn remove_domain(&self, name: &str) -> Result<(), KvmError> {
        let Some(domain) = self.domain(name)? else {
            return Ok(());
        };
        self.forget_mark(&domain);
        if self.call("virDomainIsActive", name, || domain.is_active())? {
            match self.call("virDomainDestroy", name, || domain.destroy()) {
                Ok(()) => {}
                // Already stopped between the two calls.
                Err(e) if e.code == Some(ErrorNumber::OperationInvalid) => {}
                Err(e) => return Err(e),
            }
        }
        let flags = virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM
            | virt::sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
            | virt::sys::VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
            | virt::sys::VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA;
        match self.call("virDomainUndefineFlags", name, || domain.undefine_flags(flags)) {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every domain the operator marked as managed, with its state.
    pub fn managed_domains(&self) -> Result<Vec<(String, DomainRunState, InstanceMetadata)>, KvmError> {
        let domains = self.call("virConnectListAllDomains", &self.host, || {
            self.conn.list_all_domains(0)
        })?;
        let mut out = Vec::new();
        for domain in domains {
            let Ok(name) = domain.name() else { continue };
            // One unreadable domain is skipped, not fatal. The mark is read
            // afresh: the sweep decides what to delete by it.
            match (self.run_state(&domain, &name), self.metadata_of(&domain, &name)) {
                (Ok(state), Ok(Some(meta))) if meta.managed => out.push((name, state, meta)),
                _ => {}
            }
        }
        Ok(out)
    }
}

fn error(rpc: &'static str, target: &str, e: virt::error::Error) -> KvmError {
    let code = match e.code() {
        virt::error::ErrorNumberEnum::Known(c) => Some(c),
        _ => None,
    };
    KvmError {
        rpc,
        target: target.to_owned(),
        code,
        message: e.message().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_file_backed_pools_name_their_volumes_paths() {
        let pool = |kind: &str, path: &str| {
            format!("<pool type='{kind}'><name>default</name><target><path>{path}</path></target></pool>")
        };
        for kind in ["dir", "fs", "netfs"] {
            assert_eq!(
                pool_directory(&pool(kind, "/var/lib/libvirt/images/")).as_deref(),
                Some("/var/lib/libvirt/images")
            );
        }
        // Volumes of these are devices or network objects, named otherwise.
        for kind in ["logical", "disk", "iscsi", "rbd", "zfs"] {
            assert_eq!(pool_directory(&pool(kind, "/dev/vg0")), None, "{kind}");
        }
        assert_eq!(pool_directory(&pool("dir", "relative")), None);
        assert_eq!(pool_directory("<pool type='dir'><name>x</name></pool>"), None);
        assert_eq!(pool_directory("not xml"), None);
    }

    #[test]
    fn disk_sources_cover_files_devices_volumes_and_backing_chains() {
        let xml = r#"<domain type='kvm'><name>x</name><devices>
            <disk type='file' device='disk'><source file='/pool/top.qcow2' index='2'/>
              <backingStore type='file' index='1'><format type='qcow2'/><source file='/pool/base.qcow2'/>
                <backingStore/></backingStore>
              <target dev='vda'/></disk>
            <disk type='block' device='disk'><source dev='/dev/vg/lv'/><target dev='vdb'/></disk>
            <disk type='volume' device='cdrom'><source pool='default' volume='seed.iso'/><target dev='sda'/></disk>
            <disk type='file' device='cdrom'><target dev='sdb'/></disk>
            <interface type='bridge'><source bridge='br0'/></interface>
            <serial type='pty'><source path='/dev/pts/3'/></serial>
          </devices></domain>"#;
        let mut found = disk_sources(xml);
        found.sort();
        assert_eq!(
            found,
            [
                "/dev/vg/lv",
                "/pool/base.qcow2",
                "/pool/top.qcow2",
                "default/seed.iso"
            ],
            "an empty cdrom, the NIC and the serial port are no disks"
        );
        assert!(disk_sources("not xml").is_empty());
    }
}
