//! A real Squid on a loopback port, with extra configuration lines.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Squid {
    pub addr: SocketAddr,
    child: Option<Child>,
    dir: tempfile::TempDir,
    extra: String,
}

pub fn binary() -> Option<PathBuf> {
    ["/usr/sbin/squid", "/usr/bin/squid"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

impl Squid {
    /// Starts Squid on a free port; `None` when Squid is not installed (CI installs it).
    pub async fn start(extra: &str) -> Option<Self> {
        binary()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut squid = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child: None,
            dir: tempfile::tempdir().unwrap(),
            extra: extra.to_owned(),
        };
        squid.run().await;
        Some(squid)
    }

    async fn run(&mut self) {
        let dir = self.dir.path();
        let conf = format!(
            "http_port {addr}\n{extra}\nhttp_access allow all\nvia off\nforwarded_for delete\n\
             max_filedescriptors 1024\ncache deny all\npinger_enable off\nshutdown_lifetime 0 seconds\n\
             pid_filename {d}/squid.pid\ncache_log {d}/cache.log\naccess_log {d}/access.log\n",
            addr = self.addr,
            extra = self.extra,
            d = dir.display()
        );
        std::fs::write(dir.join("squid.conf"), conf).unwrap();
        if nix_is_root() {
            let _ = Command::new("chown").arg("proxy").arg(dir).status();
        }
        // A service name of its own: Squids sharing one collide on shared memory.
        let child = Command::new(binary().unwrap())
            .args(["-N", "-n", &self.service(), "-f"])
            .arg(dir.join("squid.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        super::eventually_explained(
            "squid to start",
            Duration::from_secs(15),
            || std::fs::read_to_string(dir.join("cache.log")).unwrap_or_default(),
            async || tokio::net::TcpStream::connect(self.addr).await,
        )
        .await;
    }

    fn service(&self) -> String {
        format!("epotest{}", self.addr.port())
    }

    /// SIGKILLs Squid (the port stops answering) and removes the shared
    /// memory it could not.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let prefix = format!("{}-", self.service());
        for entry in std::fs::read_dir("/dev/shm").into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// Starts it again on the same port.
    pub async fn restart(&mut self) {
        self.kill();
        self.run().await;
    }
}

fn nix_is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

impl Drop for Squid {
    fn drop(&mut self) {
        self.kill();
    }
}
