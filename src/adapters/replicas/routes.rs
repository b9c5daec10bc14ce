//! Where a lease call is served when every replica serves: by the replica
//! that granted the lease (its tag begins the lease id). A live member's
//! leases are its own; a dead member's are the leader's once it has
//! adopted its journal, and until then a call on one is answered 503 with
//! `Retry-After` (nothing is answered from a book that does not hold it).
//!
//! ```text
//!  lease call on replica R for id "<tag>-…"
//!    tag = R                      → R serves it
//!    tag a live member M          → forwarded to M
//!    otherwise, R is not leader   → forwarded to the leader
//!    otherwise (R leads)          → R serves it once the tag is adopted; 503 before
//! ```

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use super::members::MemberTable;
use crate::domain::lease::lease_id::tag_of;
use crate::domain::membership::MemberTag;

/// Where one call goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// This replica serves it.
    Here,
    /// The replica at this address holds it.
    There(String),
    /// Its holder died and the leader has not adopted its journal yet.
    NotYet,
}

/// What the leader has still to adopt (empty on other replicas).
#[derive(Default)]
pub struct Adoptions {
    /// The leader has looked for every journal left behind at takeover.
    scanned: AtomicBool,
    /// The checkpoint of a release where only the leader served (untagged
    /// lease ids) is adopted.
    untagged_adopted: AtomicBool,
    pending: Mutex<BTreeSet<MemberTag>>,
}

impl Adoptions {
    pub fn pending(&self, tag: &MemberTag) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(tag.clone());
    }

    pub fn done(&self, tag: &MemberTag) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(tag);
    }

    pub fn scanned(&self) {
        self.scanned.store(true, Ordering::Release);
    }

    pub fn untagged_adopted(&self) {
        self.untagged_adopted.store(true, Ordering::Release);
    }

    fn waits_for_untagged(&self) -> bool {
        !self.untagged_adopted.load(Ordering::Acquire)
    }

    fn waits_for(&self, tag: &MemberTag) -> bool {
        !self.scanned.load(Ordering::Acquire)
            || self
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(tag)
    }

    pub fn waiting(&self) -> Vec<MemberTag> {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }
}

/// A replica's routing of lease calls.
#[derive(Clone)]
pub struct LeaseRoutes {
    me: MemberTag,
    /// This replica's internal address (the leader's, when it leads).
    advertise: String,
    tables: watch::Receiver<MemberTable>,
    leader: watch::Receiver<Option<String>>,
    adoptions: Arc<Adoptions>,
}

impl LeaseRoutes {
    pub fn new(
        me: MemberTag,
        advertise: String,
        tables: watch::Receiver<MemberTable>,
        leader: watch::Receiver<Option<String>>,
        adoptions: Arc<Adoptions>,
    ) -> Self {
        Self {
            me,
            advertise,
            tables,
            leader,
            adoptions,
        }
    }

    /// Where a client's call on lease `id` goes.
    pub fn route(&self, id: &str) -> Route {
        let Some(tag) = tag_of(id) else {
            return self.untagged();
        };
        if tag == self.me {
            return Route::Here;
        }
        if let Some(address) = self.tables.borrow().address_of(&tag) {
            return Route::There(address.to_owned());
        }
        self.at_leader(&tag)
    }

    /// Where a call forwarded to this replica goes: served here, unless
    /// this replica leads and the holder is alive after all (the sender's
    /// table lagged), or its journal is not adopted yet.
    pub fn route_forwarded(&self, id: &str) -> Route {
        let Some(tag) = tag_of(id) else {
            // Sent here as to the leader: not again if it no longer leads.
            return match self.untagged() {
                Route::There(_) => Route::NotYet,
                here_or_not_yet => here_or_not_yet,
            };
        };
        if tag == self.me || !self.leads() {
            return Route::Here;
        }
        if let Some(address) = self.tables.borrow().address_of(&tag) {
            return Route::There(address.to_owned());
        }
        self.at_leader(&tag)
    }

    fn leads(&self) -> bool {
        self.leader.borrow().as_deref() == Some(self.advertise.as_str())
    }

    /// An untagged id: a lease granted before every replica served (or
    /// none at all), the leader's once it adopted the old checkpoint.
    fn untagged(&self) -> Route {
        match self.leader.borrow().clone() {
            Some(leader) if leader != self.advertise => Route::There(leader),
            Some(_) if self.adoptions.waits_for_untagged() => Route::NotYet,
            Some(_) => Route::Here,
            None => Route::NotYet,
        }
    }

    /// A lease of a member that is not live: the leader's to serve.
    fn at_leader(&self, tag: &MemberTag) -> Route {
        match self.leader.borrow().clone() {
            Some(leader) if leader != self.advertise => Route::There(leader),
            Some(_) if self.adoptions.waits_for(tag) => Route::NotYet,
            Some(_) => Route::Here,
            // No leader known yet: nobody may answer for a dead member.
            None => Route::NotYet,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::replicas::members::Member;

    fn tag(i: u8) -> MemberTag {
        MemberTag::of(&format!("replica-{i}"), &[i; 8])
    }

    fn id(tag: &MemberTag) -> String {
        crate::domain::lease::lease_id::make(Some(tag), [7; 16])
    }

    fn table(live: &[(MemberTag, &str)]) -> MemberTable {
        MemberTable {
            live: live
                .iter()
                .map(|(tag, address)| Member {
                    tag: tag.clone(),
                    address: Some((*address).to_owned()),
                    pod: None,
                })
                .collect(),
            ..MemberTable::default()
        }
    }

    /// Each row: who asks, who leads, the holder's state, and the route.
    #[test]
    fn where_each_lease_call_goes() {
        let (a, b, dead) = (tag(1), tag(2), tag(9));
        let members = table(&[(a.clone(), "a:1"), (b.clone(), "b:1")]);
        let adoptions = Arc::new(Adoptions::default());
        let routes = |me: &MemberTag, advertise: &str, leader: Option<&str>| {
            LeaseRoutes::new(
                me.clone(),
                advertise.to_owned(),
                watch::channel(members.clone()).1,
                watch::channel(leader.map(str::to_owned)).1,
                adoptions.clone(),
            )
        };
        let on_a = routes(&a, "a:1", Some("b:1"));
        let on_b = routes(&b, "b:1", Some("b:1"));
        let nowhere = routes(&a, "a:1", None);
        assert_eq!(on_a.route(&id(&a)), Route::Here, "its own");
        assert_eq!(on_a.route(&id(&b)), Route::There("b:1".into()), "a live member's");
        assert_eq!(
            on_a.route(&id(&dead)),
            Route::There("b:1".into()),
            "a dead member's: the leader's"
        );
        let untagged = "1b4e28ba-2fa1-41d2-883f-0016d3cca427";
        assert_eq!(
            on_a.route(untagged),
            Route::There("b:1".into()),
            "no tag (from before every replica served): the leader's"
        );
        assert_eq!(nowhere.route(untagged), Route::NotYet, "no tag, no leader known");
        assert_eq!(
            on_b.route(untagged),
            Route::NotYet,
            "the leader before it adopted the old checkpoint"
        );
        assert_eq!(
            on_a.route_forwarded(untagged),
            Route::NotYet,
            "forwarded to a replica that no longer leads: not again"
        );
        assert_eq!(nowhere.route(&id(&dead)), Route::NotYet, "no leader known");
        assert_eq!(
            on_b.route(&id(&dead)),
            Route::NotYet,
            "the leader before its scan"
        );
        adoptions.scanned();
        adoptions.pending(&dead);
        assert_eq!(on_b.route(&id(&dead)), Route::NotYet, "pending adoption");
        adoptions.done(&dead);
        assert_eq!(
            on_b.route(&id(&dead)),
            Route::Here,
            "adopted: the leader's book holds it"
        );
        // Forwarded calls are served where they land, except at the leader
        // for a holder that is alive after all.
        assert_eq!(
            on_a.route_forwarded(&id(&b)),
            Route::Here,
            "a follower never forwards again"
        );
        assert_eq!(on_b.route_forwarded(&id(&a)), Route::There("a:1".into()));
        assert_eq!(on_b.route_forwarded(&id(&dead)), Route::Here);
        adoptions.untagged_adopted();
        assert_eq!(on_b.route(untagged), Route::Here, "the old checkpoint adopted");
        assert_eq!(on_b.route_forwarded(untagged), Route::Here);
    }
}
