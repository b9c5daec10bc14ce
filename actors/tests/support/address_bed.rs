//! Addresses of this machine that are not loopback: a bridge interface the
//! test creates (no ports, nothing leaves the machine) carrying the private,
//! link-local and unique-local addresses a test needs, removed on drop —
//! also when the test fails. Needs root (CI runs tests as root).

use std::net::IpAddr;
use std::process::{Command, Stdio};

pub struct AddressBed {
    interface: String,
}

impl AddressBed {
    /// `None` when not root. `tag` keeps the beds of parallel tests apart.
    pub fn create(tag: u8, addresses: &[IpAddr]) -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let interface = format!("epod{}x{tag}", std::process::id() % 100_000);
        // A bed a killed run of this process id left behind.
        let _ = ip(&["link", "del", &interface]);
        ip(&["link", "add", &interface, "type", "bridge"]).expect("creating the bed's bridge");
        let bed = Self { interface };
        for address in addresses {
            let (cidr, extra): (String, &[&str]) = match address {
                IpAddr::V4(_) => (format!("{address}/32"), &[]),
                // No duplicate address detection: the address is usable at once.
                IpAddr::V6(_) => (format!("{address}/128"), &["nodad"]),
            };
            let mut args = vec!["addr", "add", &cidr, "dev", &bed.interface];
            args.extend_from_slice(extra);
            ip(&args).unwrap_or_else(|e| panic!("adding {cidr} to the bed: {e}"));
        }
        ip(&["link", "set", &bed.interface, "up"]).expect("bringing the bed up");
        Some(bed)
    }
}

impl Drop for AddressBed {
    fn drop(&mut self) {
        if let Err(e) = ip(&["link", "del", &self.interface]) {
            eprintln!("removing test bridge {}: {e}", self.interface);
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
