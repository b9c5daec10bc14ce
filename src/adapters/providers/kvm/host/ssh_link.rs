//! The SSH link to one libvirt host: an SSH connection (russh) whose
//! direct-streamlocal channels reach the host's libvirt socket, exposed on a
//! private local unix socket that libvirt's client connects to with
//! `qemu+unix:///system?socket=…`. The host needs nothing but sshd and
//! libvirtd, and nothing is exposed beyond sshd. Dropping or closing the link
//! tears the SSH connection down, which also ends any libvirt call blocked on
//! it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use russh::client::{self, Handle};
use russh::keys::{PrivateKey, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

/// How to reach and trust one host.
#[derive(Clone, Debug)]
pub struct LinkTarget {
    /// `host:port` of sshd.
    pub address: String,
    pub user: String,
    /// libvirt's socket on the host.
    pub remote_socket: String,
    /// `None` = insecure mode (host key not verified; logged).
    pub known_hosts: Option<PathBuf>,
}

/// The link could not be established or broke.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("dialing {address}: timed out after {after:?}")]
    DialTimeout { address: String, after: Duration },
    #[error("dialing {address}: {reason}")]
    Dial { address: String, reason: String },
    #[error("host key of {address} is not trusted by known_hosts ({reason})")]
    HostKey { address: String, reason: String },
    #[error("SSH authentication as {user}@{address} was refused")]
    AuthRefused { user: String, address: String },
    #[error("local socket for {address}: {reason}")]
    LocalSocket { address: String, reason: String },
}

impl LinkError {
    /// Retrying can help (network trouble), unlike a refused key or host key.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            LinkError::DialTimeout { .. } | LinkError::Dial { .. } | LinkError::LocalSocket { .. }
        )
    }
}

struct Verifier {
    host: String,
    port: u16,
    known_hosts: Option<PathBuf>,
    rejected: Arc<std::sync::Mutex<Option<String>>>,
}

impl client::Handler for Verifier {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let Some(path) = &self.known_hosts else {
            tracing::warn!(host = %self.host, port = self.port, "insecureIgnoreHostKey: host key NOT verified");
            return Ok(true);
        };
        let PublicKeyOrCertificate::PublicKey { key, .. } = key else {
            *self.rejected.lock().unwrap_or_else(|p| p.into_inner()) =
                Some("certificates are not accepted".into());
            return Ok(false);
        };
        let verdict = match russh::keys::check_known_hosts_path(&self.host, self.port, key, path) {
            Ok(true) => None,
            Ok(false) => Some(format!(
                "no entry for [{}]:{} in {}",
                self.host,
                self.port,
                path.display()
            )),
            Err(e) => Some(e.to_string()),
        };
        let ok = verdict.is_none();
        *self.rejected.lock().unwrap_or_else(|p| p.into_inner()) = verdict;
        Ok(ok)
    }
}

/// A live link; the local socket lives in a private directory.
pub struct SshLink {
    handle: Arc<Handle<Verifier>>,
    socket: PathBuf,
    _dir: tempfile::TempDir,
    forwarder: JoinHandle<()>,
    address: String,
}

impl SshLink {
    /// Dials `target` within `timeout`, authenticates with `key`, and starts forwarding.
    pub async fn dial(
        target: &LinkTarget,
        key: Arc<PrivateKey>,
        timeout: Duration,
    ) -> Result<Self, LinkError> {
        let address = target.address.clone();
        let (host, port) = split_host_port(&address).ok_or_else(|| LinkError::Dial {
            address: address.clone(),
            reason: "not host:port".into(),
        })?;
        let rejected = Arc::new(std::sync::Mutex::new(None));
        let verifier = Verifier {
            host: host.to_owned(),
            port,
            known_hosts: target.known_hosts.clone(),
            rejected: rejected.clone(),
        };
        let config = Arc::new(client::Config {
            // A stalled server is noticed within about 15 s.
            keepalive_interval: Some(Duration::from_secs(5)),
            keepalive_max: 3,
            inactivity_timeout: None,
            nodelay: true,
            preferred: russh::Preferred {
                cipher: std::borrow::Cow::Borrowed(cipher_order()),
                ..russh::Preferred::DEFAULT
            },
            ..client::Config::default()
        });
        let connect = client::connect(config, (host, port), verifier);
        let mut handle = match tokio::time::timeout(timeout, connect).await {
            Err(_) => {
                return Err(LinkError::DialTimeout {
                    address,
                    after: timeout,
                });
            }
            Ok(Err(e)) => {
                if let Some(reason) = rejected.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    return Err(LinkError::HostKey { address, reason });
                }
                return Err(LinkError::Dial {
                    address,
                    reason: e.to_string(),
                });
            }
            Ok(Ok(handle)) => handle,
        };
        let auth = handle
            .authenticate_publickey(&target.user, PrivateKeyWithHashAlg::new(key, None))
            .await
            .map_err(|e| LinkError::Dial {
                address: address.clone(),
                reason: e.to_string(),
            })?;
        if !matches!(auth, client::AuthResult::Success) {
            return Err(LinkError::AuthRefused {
                user: target.user.clone(),
                address,
            });
        }

        let dir = tempfile::Builder::new()
            .prefix("epo-libvirt-")
            .tempdir()
            .map_err(|e| LinkError::LocalSocket {
                address: address.clone(),
                reason: e.to_string(),
            })?;
        let socket = dir.path().join("libvirt.sock");
        let listener = UnixListener::bind(&socket).map_err(|e| LinkError::LocalSocket {
            address: address.clone(),
            reason: e.to_string(),
        })?;
        let handle = Arc::new(handle);
        let forwarder = tokio::spawn(forward(
            listener,
            handle.clone(),
            target.remote_socket.clone(),
            address.clone(),
        ));
        tracing::debug!(host = %address, "SSH link up");
        Ok(Self {
            handle,
            socket,
            _dir: dir,
            forwarder,
            address,
        })
    }

    /// The URI libvirt's client opens to reach the host's daemon.
    pub fn libvirt_uri(&self) -> String {
        format!("qemu+unix:///system?socket={}", self.socket.display())
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Whether the SSH connection has ended (keepalive failure, server gone).
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Ends the link: the SSH connection closes, and with it every forwarded
    /// libvirt connection (a blocked libvirt call returns with an error).
    pub async fn close(self) {
        self.forwarder.abort();
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "closing", "en")
            .await;
        tracing::debug!(host = %self.address, "SSH link closed");
    }
}

impl Drop for SshLink {
    fn drop(&mut self) {
        self.forwarder.abort();
    }
}

/// Each local connection gets its own channel to the remote socket.
async fn forward(listener: UnixListener, handle: Arc<Handle<Verifier>>, remote: String, address: String) {
    loop {
        let Ok((mut local, _)) = listener.accept().await else {
            return;
        };
        let channel = match handle.channel_open_direct_streamlocal(remote.clone()).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(host = %address, error = %e, "opening the libvirt channel failed");
                continue;
            }
        };
        tokio::spawn(async move {
            let mut remote = channel.into_stream();
            let _ = tokio::io::copy_bidirectional(&mut local, &mut remote).await;
        });
    }
}

fn split_host_port(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host, port.parse().ok()?))
}

/// The link's ciphers, best first. Image uploads move gigabytes over the
/// link, and on a CPU with AES instructions AES-GCM costs a fraction of
/// ChaCha20-Poly1305 (whose Poly1305 has no vector code in ring on x86):
/// there it goes first. Without them ChaCha20 is the faster, constant-time
/// choice, as OpenSSH has it.
fn cipher_order() -> &'static [russh::cipher::Name] {
    use russh::cipher::{AES_128_CTR, AES_192_CTR, AES_256_CTR, AES_256_GCM, CHACHA20_POLY1305};
    const AES_FIRST: &[russh::cipher::Name] = &[
        AES_256_GCM,
        CHACHA20_POLY1305,
        AES_256_CTR,
        AES_192_CTR,
        AES_128_CTR,
    ];
    const CHACHA_FIRST: &[russh::cipher::Name] = &[
        CHACHA20_POLY1305,
        AES_256_GCM,
        AES_256_CTR,
        AES_192_CTR,
        AES_128_CTR,
    ];
    if has_aes_instructions() {
        AES_FIRST
    } else {
        CHACHA_FIRST
    }
}

fn has_aes_instructions() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes") && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}
