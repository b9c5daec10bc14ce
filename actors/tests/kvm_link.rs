//! The SSH link to a real libvirt daemon behind a real sshd on loopback
//! (tests/kvm-testbed.sh). Without the test bed these tests say so and skip;
//! CI sets the bed up, so there they always run.

mod support;

use std::sync::Arc;
use std::time::Duration;

use egress_proxies::kvm::libvirt::ensure_client_setup;
use egress_proxies::kvm::ssh_key::load_private_key;
use egress_proxies::kvm::ssh_link::{LinkError, SshLink};
use support::kvm_bed::target;

#[tokio::test]
async fn libvirt_over_the_ssh_link_lists_the_pool() {
    let bed = bed_or_skip!();
    ensure_client_setup();
    let key = Arc::new(load_private_key(bed["EPO_KVM_SSH_KEY"].as_ref()).unwrap());
    let link = SshLink::dial(&target(&bed, "EPO_KVM_HOST_A"), key, Duration::from_secs(10))
        .await
        .unwrap();
    let uri = link.libvirt_uri();
    let pools = tokio::task::spawn_blocking(move || {
        let conn = virt::connect::Connect::open(Some(&uri)).unwrap();
        let names: Vec<String> = conn
            .list_all_storage_pools(0)
            .unwrap()
            .iter()
            .map(|p| p.name().unwrap())
            .collect();
        drop(conn);
        names
    })
    .await
    .unwrap();
    assert!(pools.contains(&"default".to_owned()), "{pools:?}");
    assert!(!link.is_closed());
    link.close().await;
}

#[tokio::test]
async fn an_unknown_host_key_is_refused() {
    let bed = bed_or_skip!();
    let key = Arc::new(load_private_key(bed["EPO_KVM_SSH_KEY"].as_ref()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("known_hosts");
    // A valid known_hosts whose key for this host is someone else's.
    std::fs::write(
        &other,
        format!("[127.0.0.1]:{} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n", bed["EPO_KVM_HOST_A"].rsplit_once(':').unwrap().1),
    )
    .unwrap();
    let mut t = target(&bed, "EPO_KVM_HOST_A");
    t.known_hosts = Some(other);
    match SshLink::dial(&t, key, Duration::from_secs(10)).await {
        Err(e @ LinkError::HostKey { .. }) => assert!(!e.is_transient(), "{e}"),
        Err(other) => panic!("expected a host-key refusal, got {other}"),
        Ok(_) => panic!("a wrong host key was accepted"),
    }
}

#[tokio::test]
async fn a_dead_port_is_a_transient_dial_error() {
    let bed = bed_or_skip!();
    let key = Arc::new(load_private_key(bed["EPO_KVM_SSH_KEY"].as_ref()).unwrap());
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut t = target(&bed, "EPO_KVM_HOST_A");
    t.address = dead.to_string();
    let err = SshLink::dial(&t, key, Duration::from_secs(5))
        .await
        .err()
        .expect("nothing listens there");
    assert!(err.is_transient(), "{err}");
}
