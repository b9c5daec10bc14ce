//! Process-wide libvirt client setup: the default event loop (needed for
//! connection keepalive) runs on its own thread, and libvirt's habit of
//! printing every error to stderr is switched off — errors are returned and
//! logged by the provider instead.

use std::sync::Once;

use crate::domain::backoff::{Attempts, ladders};

static SETUP: Once = Once::new();

/// Registers libvirt's default event loop and runs it on a dedicated thread
/// (once per process). Blocking libvirt calls must never run on the async
/// executor threads; this thread only dispatches libvirt's own events.
pub fn ensure_client_setup() {
    SETUP.call_once(|| {
        virt::error::clear_error_callback();
        if let Err(e) = virt::event::event_register_default_impl() {
            tracing::warn!(error = %e, "registering libvirt's event loop failed; keepalive is off");
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("libvirt-events".into())
            .spawn(|| {
                let mut failed = Attempts::default();
                loop {
                    match virt::event::event_run_default_impl() {
                        Ok(()) => failed.reset(),
                        Err(e) => {
                            tracing::warn!(error = %e, "libvirt event loop iteration failed");
                            std::thread::sleep(failed.next_step(&ladders::LIBVIRT_EVENT_LOOP));
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "starting libvirt's event thread failed; keepalive is off");
        }
    });
}
