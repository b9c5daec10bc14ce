//! A gateway lease taken back by the lease store: fair shares reclaim a
//! tunnel of an identity holding more than its share for one waiting below
//! its own (docs/gateway.md, "Fair shares"). The store keeps the
//! [`Revoker`]; the tunnel holding the lease watches its [`Revocation`] and
//! closes when it fires, which releases the lease.

use tokio::sync::watch;

/// The store's side: fires once.
#[derive(Debug)]
pub struct Revoker(watch::Sender<bool>);

/// The lease holder's side.
#[derive(Clone, Debug)]
pub struct Revocation(Option<watch::Receiver<bool>>);

/// A revocation pair for one lease.
pub fn revocation() -> (Revoker, Revocation) {
    let (tx, rx) = watch::channel(false);
    (Revoker(tx), Revocation(Some(rx)))
}

impl Revoker {
    /// Tells the holder to give the lease back.
    pub fn revoke(&self) {
        self.0.send_replace(true);
    }

    /// Whether the holder still watches (its tunnel or request is open).
    pub fn watched(&self) -> bool {
        self.0.receiver_count() > 0
    }
}

impl Revocation {
    /// A lease nobody takes back.
    pub fn never() -> Self {
        Self(None)
    }

    /// Whether it has fired.
    pub fn is_revoked(&self) -> bool {
        self.0.as_ref().is_some_and(|rx| *rx.borrow())
    }

    /// Completes when the lease is taken back; never if it is not (the
    /// store forgetting the lease is not a revocation).
    pub async fn revoked(self) {
        if let Some(mut rx) = self.0
            && rx.wait_for(|revoked| *revoked).await.is_ok()
        {
            return;
        }
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_revocation_fires_once_revoked_and_never_otherwise() {
        let (revoker, watched) = revocation();
        assert!(revoker.watched());
        let waiting = tokio::spawn(watched.clone().revoked());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        revoker.revoke();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("fired")
            .unwrap();
        assert!(watched.is_revoked());

        let (revoker, forgotten) = revocation();
        drop(revoker);
        let forgotten = tokio::time::timeout(Duration::from_millis(50), forgotten.revoked()).await;
        assert!(forgotten.is_err(), "a dropped revoker is not a revocation");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), Revocation::never().revoked())
                .await
                .is_err()
        );
    }
}
