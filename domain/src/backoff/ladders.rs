//! Every backoff ladder of the operator, with why each value is what it
//! is: the one place to read or change how long anything waits before it
//! tries again. docs/architecture.md ("Backoff") lists them with where
//! each is used.

use std::time::Duration;

use super::{Backoff, Jitter};

const fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

const fn secs(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

/// A Proxy's work in flight (a VM booting, a pod starting) looked at
/// again: closely at first, when most of it finishes, then no more than
/// every 15 s (`Schedule`, `Timing::polls`). Spread up to twice the step
/// so ten thousand Proxies created together do not poll together.
pub const PROXY_POLL: Backoff = Backoff {
    immediate: 0,
    first: ms(500),
    factor: 2,
    cap: secs(15),
    jitter: Jitter::UP_TO_DOUBLE,
};

/// A reconcile that failed (a provider or store error) tried again: a
/// second first, up to five minutes for a provider that stays down
/// (`Timing::errors`).
pub const PROXY_ERROR: Backoff = Backoff {
    immediate: 0,
    first: secs(1),
    factor: 2,
    cap: secs(300),
    jitter: Jitter::UP_TO_DOUBLE,
};

/// A reconcile refused for quota tried again: quotas refill over minutes,
/// not seconds (`Timing::quota`).
pub const PROXY_QUOTA: Backoff = Backoff {
    immediate: 0,
    first: secs(120),
    factor: 2,
    cap: secs(600),
    jitter: Jitter::UP_TO_DOUBLE,
};

/// A deletion the provider refuses for good, asked again
/// (`Schedule::deletion_refused`): something outside may fix it, so it is
/// asked again, but not more than every ten minutes.
pub const DELETION_REFUSED: Backoff = Backoff {
    immediate: 0,
    first: secs(30),
    factor: 2,
    cap: secs(600),
    jitter: Jitter::NONE,
};

/// Lost instances replaced (`ReplacementBackoff`, kept in
/// `status.replacement`): the first replacement at once — cattle, not
/// pets — then 10 s doubling to five minutes, so instances that die at
/// start do not become a create/delete loop of VMs.
pub const REPLACEMENT: Backoff = Backoff {
    immediate: 1,
    first: secs(10),
    factor: 2,
    cap: secs(300),
    jitter: Jitter::NONE,
};

/// A Kubernetes API request refused with 429 (or a retryable 503) and no
/// `Retry-After` long enough, sent again (`kube_client::retry`): half a
/// second doubling to 8 s, spread over the lower half of each step so
/// clients refused together do not come back together and no wait
/// exceeds its step.
pub const KUBE_API_REFUSED: Backoff = Backoff {
    immediate: 0,
    first: ms(500),
    factor: 2,
    cap: secs(8),
    jitter: Jitter::LOWER_HALF,
};

/// A watch whose API server does not answer (connection refused or reset,
/// a broken stream), tried again (`kube_client::watch_retry`): trying
/// costs the server nothing, so never more than 2 s apart and the watch is
/// back within about 2 s of the server's return. ±20 % so replicas and
/// watches do not retry in step.
pub const WATCH_UNREACHABLE: Backoff = Backoff {
    immediate: 0,
    first: ms(500),
    factor: 2,
    cap: secs(2),
    jitter: Jitter::PLUS_MINUS_20_PERCENT,
};

/// A watch the API server refuses (429, 5xx, 403, or a 410 again soon),
/// tried again (`kube_client::watch_retry`): client-go's reflector's
/// 800 ms doubling to 30 s, to spare a struggling server; ±20 %.
pub const WATCH_REFUSED: Backoff = Backoff {
    immediate: 0,
    first: ms(800),
    factor: 2,
    cap: secs(30),
    jitter: Jitter::PLUS_MINUS_20_PERCENT,
};

/// A KVM host's SSH link dialled again after a loss or a failed dial
/// (the host actor's `Redial`): at once after the first loss, then 1 s
/// doubling to 30 s while dials keep failing.
pub const KVM_REDIAL: Backoff = Backoff {
    immediate: 1,
    first: secs(1),
    factor: 2,
    cap: secs(30),
    jitter: Jitter::NONE,
};

/// An actor restarted by its supervisor: three restarts within the
/// restart window at once, then 200 ms doubling to 30 s, so a panic on
/// start cannot spin a core.
pub const ACTOR_RESTART: Backoff = Backoff {
    immediate: 3,
    first: ms(200),
    factor: 2,
    cap: secs(30),
    jitter: Jitter::NONE,
};

/// A registry restarted by its supervisor lists the store's keys again
/// after a failed list: every 5 s, the store's own client retries below.
pub const REGISTRY_RELIST: Backoff = Backoff::fixed(secs(5));

/// Lease checkpoint shards whose write failed, written again: every half
/// second, so a checkpoint (and the grants waiting for it) is late by
/// little once the API answers again; giving up is a separate deadline.
pub const LEASE_CHECKPOINT_WRITE: Backoff = Backoff::fixed(ms(500));

/// A listener's accept failed for want of descriptors or memory: 100 ms
/// for an evicted connection to give one back.
pub const ACCEPT_EXHAUSTED: Backoff = Backoff::fixed(ms(100));

/// Any other accept error (a connection reset before it was accepted):
/// the next accept is most likely fine, 5 ms only keeps it from spinning.
pub const ACCEPT_ERROR: Backoff = Backoff::fixed(ms(5));

/// An iteration of libvirt's client event loop failed: 100 ms before the
/// next, so a broken loop logs ten lines a second rather than spinning.
pub const LIBVIRT_EVENT_LOOP: Backoff = Backoff::fixed(ms(100));

/// Every ladder by name, for the table test and the docs.
pub const ALL: [(&str, Backoff); 15] = [
    ("PROXY_POLL", PROXY_POLL),
    ("PROXY_ERROR", PROXY_ERROR),
    ("PROXY_QUOTA", PROXY_QUOTA),
    ("DELETION_REFUSED", DELETION_REFUSED),
    ("REPLACEMENT", REPLACEMENT),
    ("KUBE_API_REFUSED", KUBE_API_REFUSED),
    ("WATCH_UNREACHABLE", WATCH_UNREACHABLE),
    ("WATCH_REFUSED", WATCH_REFUSED),
    ("KVM_REDIAL", KVM_REDIAL),
    ("ACTOR_RESTART", ACTOR_RESTART),
    ("REGISTRY_RELIST", REGISTRY_RELIST),
    ("LEASE_CHECKPOINT_WRITE", LEASE_CHECKPOINT_WRITE),
    ("ACCEPT_EXHAUSTED", ACCEPT_EXHAUSTED),
    ("ACCEPT_ERROR", ACCEPT_ERROR),
    ("LIBVIRT_EVENT_LOOP", LIBVIRT_EVENT_LOOP),
];
