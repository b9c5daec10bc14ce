//! The book's durable state as a [`LeaseSnapshot`], and bringing one back
//! into a new book. Proxies are not
//! known yet when it is restored (their actors report availability later),
//! so a proxy named by a lease or a rest becomes a *placeholder*: unlisted
//! and never leased, but carrying its leases against its capacity and its
//! rests until its availability arrives. A placeholder that holds nothing
//! any more (its proxy was deleted while the operator was down) is dropped;
//! one that holds only a tally of blocks and errors waits [`TALLY_GRACE`]
//! for its proxy first.

use crate::now::Now;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use jiff::Timestamp;

use super::{Ended, Entry, Lease, LeaseBook, ProxyId, TALLY_GRACE};
use crate::lease::Availability;
use crate::lease::MAX_BLOCKED_TARGETS;
use crate::lease::journal::{EndedRecord, LeaseChange, LeaseRecord, LeaseSnapshot, ProxyTally};
use crate::resource::ObjectKey;

impl LeaseBook {
    /// Everything a restarted book must remember, as of `now`.
    pub fn snapshot(&self, now: Instant) -> LeaseSnapshot {
        let key = |id: &ProxyId| self.proxies.get(id).map(|e| e.availability.key.clone());
        let mut snapshot = LeaseSnapshot::default();
        for (id, lease) in &self.leases {
            let Some(proxy) = key(&lease.proxy) else { continue };
            snapshot.leases.push(LeaseRecord {
                id: id.clone(),
                proxy,
                target: lease.target.clone(),
                expires: self.wall(lease.expires),
                ttl_ms: u64::try_from(lease.ttl.as_millis()).unwrap_or(u64::MAX),
                client: lease.client.clone(),
                owner: lease.owner.clone(),
            });
        }
        for (id, ended) in &self.ended {
            // A gateway lease's record ends with the process, as the lease does.
            if let (true, false, Some(proxy)) = (ended.until > now, ended.gateway, key(&ended.proxy)) {
                snapshot.ended.push(EndedRecord {
                    id: id.clone(),
                    proxy,
                    target: ended.target.clone(),
                    until: self.wall(ended.until),
                    owner: ended.owner.clone(),
                });
            }
        }
        for (target, state) in &self.targets {
            for (proxy, until) in state.rests() {
                if let (true, Some(key)) = (until > now, key(&proxy)) {
                    snapshot
                        .target_rests
                        .push((target.clone(), key, self.wall(until)));
                }
            }
        }
        for entry in self.proxies.values() {
            if let Some(until) = entry.global_cooldown.filter(|u| *u > now) {
                snapshot
                    .proxy_rests
                    .push((entry.availability.key.clone(), self.wall(until)));
            }
        }
        for entry in self.proxies.values() {
            if !entry.blocked_targets.is_empty() || entry.errors > 0 {
                snapshot.tallies.push(ProxyTally {
                    proxy: entry.availability.key.clone(),
                    blocked_targets: entry.blocked_targets.iter().cloned().collect(),
                    errors: entry.errors,
                });
            }
        }
        snapshot.tallies.sort_by(|a, b| a.proxy.cmp(&b.proxy));
        snapshot.leases.sort_by(|a, b| a.id.cmp(&b.id));
        snapshot.ended.sort_by(|a, b| a.id.cmp(&b.id));
        snapshot.target_rests.sort();
        snapshot.proxy_rests.sort();
        snapshot
    }

    /// Restores `snapshot` (taken at any earlier time; what has expired by
    /// now is left out). Nothing restored is journaled again.
    pub fn restore(&mut self, snapshot: LeaseSnapshot, now: Instant) {
        let journaling = self.changes.take();
        // Other replicas learnt these from the replica that made them.
        let sharing = self.fleet.take();
        self.merge(snapshot, now);
        self.changes = journaling;
        self.fleet = sharing;
    }

    /// Takes over a dead replica's journal (`snapshot`): its leases and
    /// ended leases join this book's (ids it holds already are skipped, so
    /// adopting twice is adopting once), its rests end no earlier than
    /// they say, its tallies are united. Unlike a restore, all of it is
    /// journaled (the dead replica's journal is deleted next) and its rests
    /// and tallies go to the fleet again (set semantics make that harmless).
    pub fn adopt(&mut self, snapshot: LeaseSnapshot, now: Instant) {
        let fresh = |id: &String| !self.leases.contains_key(id) && !self.ended.contains_key(id);
        let leases: Vec<LeaseRecord> = snapshot.leases.into_iter().filter(|l| fresh(&l.id)).collect();
        let ended: Vec<EndedRecord> = snapshot.ended.into_iter().filter(|e| fresh(&e.id)).collect();
        let journal_leases = self.changes.is_some().then(|| (leases.clone(), ended.clone()));
        let tallies = snapshot.tallies.clone();
        self.merge(
            LeaseSnapshot {
                leases,
                ended,
                tallies: Vec::new(),
                ..snapshot
            },
            now,
        );
        // What was taken in (not expired, not a gateway's) is journaled as granted here.
        if let Some((leases, ended)) = journal_leases {
            let taken: Vec<LeaseChange> = leases
                .into_iter()
                .filter(|l| self.leases.contains_key(&l.id))
                .map(LeaseChange::Granted)
                .chain(
                    ended
                        .into_iter()
                        .filter(|e| self.ended.contains_key(&e.id))
                        .map(LeaseChange::Ended),
                )
                .collect();
            for change in taken {
                self.note(change);
            }
        }
        for tally in tallies {
            let proxy = self.placeholder(&tally.proxy);
            let Some(entry) = self.proxies.get_mut(&proxy) else {
                continue;
            };
            let mut told = Vec::new();
            for target in tally.blocked_targets {
                if entry.blocked_targets.len() >= MAX_BLOCKED_TARGETS {
                    break;
                }
                if entry.blocked_targets.insert(target) {
                    told.push(LeaseChange::BlockedBy {
                        proxy: tally.proxy.clone(),
                        target,
                    });
                }
            }
            if tally.errors > entry.errors {
                entry.errors = tally.errors;
                told.push(LeaseChange::Errors {
                    proxy: tally.proxy.clone(),
                    count: tally.errors,
                });
            }
            for change in told {
                self.tell_fleet_tally(&change);
                self.note(change);
            }
        }
    }

    /// Brings `snapshot`'s records into the book (the caller says whether
    /// what it does is journaled).
    fn merge(&mut self, snapshot: LeaseSnapshot, now: Instant) {
        let wall_now = self.wall(now);
        let at = |t: Timestamp| -> Option<Instant> {
            let ahead = t.duration_since(wall_now);
            ahead
                .is_positive()
                .then(|| now + Duration::try_from(ahead).unwrap_or(Duration::MAX / 4))
        };
        for lease in snapshot.leases {
            let Some(expires) = at(lease.expires) else {
                continue;
            };
            // A gateway lease belonged to a connection of the process that
            // wrote it, gone with that process: its proxy is free again.
            if lease
                .client
                .as_deref()
                .is_some_and(super::super::is_gateway_client)
            {
                continue;
            }
            let proxy = self.placeholder(&lease.proxy);
            let held_by = super::owner_key(lease.owner.as_deref()).to_owned();
            self.expiry.insert((expires, lease.id.clone()));
            self.targets.entry(lease.target.clone()).or_default().refs += 1;
            self.leases.insert(
                lease.id,
                Lease {
                    proxy,
                    target: lease.target,
                    expires,
                    ttl: Duration::from_millis(lease.ttl_ms),
                    client: lease.client,
                    owner: lease.owner,
                    reports: Default::default(),
                },
            );
            *self.held_by.entry(held_by).or_default() += 1;
            if let Some(entry) = self.proxies.get_mut(&proxy) {
                entry.active += 1;
            }
            self.reindex(proxy, now);
        }
        // Oldest first, as they ended: the bound on ended leases keeps the newest.
        let mut ended = snapshot.ended;
        ended.sort_by_key(|e| e.until);
        for e in ended {
            let Some(until) = at(e.until) else { continue };
            let proxy = self.placeholder(&e.proxy);
            self.targets.entry(e.target.clone()).or_default().refs += 1;
            self.ended_order.push_back((until, e.id.clone()));
            self.ended.insert(
                e.id,
                Ended {
                    until,
                    proxy,
                    target: e.target,
                    gateway: false,
                    owner: e.owner,
                },
            );
            while self.ended.len() > self.limits.max_ended {
                let Some((_, oldest)) = self.ended_order.pop_front() else {
                    break;
                };
                self.forget_ended(&oldest);
            }
        }
        for (target, key, until) in snapshot.target_rests {
            let Some(until) = at(until) else { continue };
            let proxy = self.placeholder(&key);
            self.rest_for_target(&target, proxy, until, now);
        }
        for (key, until) in snapshot.proxy_rests {
            let Some(until) = at(until) else { continue };
            let proxy = self.placeholder(&key);
            self.rest_everywhere(proxy, until, now);
            self.reindex(proxy, now);
        }
        for tally in snapshot.tallies {
            let proxy = self.placeholder(&tally.proxy);
            if let Some(entry) = self.proxies.get_mut(&proxy) {
                for target in tally.blocked_targets {
                    if entry.blocked_targets.len() >= MAX_BLOCKED_TARGETS {
                        break;
                    }
                    entry.blocked_targets.insert(target);
                }
                entry.errors = entry.errors.max(tally.errors);
            }
        }
        self.restored_at = Some(now);
    }

    /// A new book holding what this one holds — leases, ended leases, rests,
    /// proxies with their availability and blocked/error counts, report
    /// counts — with every index
    /// built afresh from those records, as a restore does. A lease store
    /// restarted after a panic continues with it: the panic may have left
    /// this book's indexes half-updated, its records are what count.
    /// Changes are not journaled by the new book until asked.
    pub fn rebuilt(&self, now: Instant) -> LeaseBook {
        let (mono, wall) = self.epoch;
        let mut book = LeaseBook::with_limits(self.settings, self.limits, Now { wall, mono });
        book.shares.clone_from(&self.shares);
        book.lease_ids = self.lease_ids.clone();
        book.restore(self.snapshot(now), now);
        for (id, entry) in &self.proxies {
            if !self.placeholders.contains(id) {
                book.upsert(entry.availability.clone(), now);
            }
        }
        for (id, lease) in &self.leases {
            if let Some(copy) = book.leases.get_mut(id) {
                copy.reports = lease.reports;
                copy.owner.clone_from(&lease.owner);
            }
        }
        book.held_by = BTreeMap::new();
        for lease in book.leases.values() {
            *book
                .held_by
                .entry(super::owner_key(lease.owner.as_deref()).to_owned())
                .or_default() += 1;
        }
        book.recent_reports = self.recent_reports.clone();
        book.restored_at = self.restored_at;
        book
    }

    /// The proxy's id, creating a placeholder for a proxy not known yet.
    pub(super) fn placeholder(&mut self, key: &ObjectKey) -> ProxyId {
        if let Some(id) = self.ids.get(key) {
            return *id;
        }
        let slots = self.slots_for(key);
        let id = self.next_id;
        self.next_id += 1;
        self.ids.insert(key.clone(), id);
        self.proxies.insert(
            id,
            Entry {
                availability: Availability {
                    key: key.clone(),
                    ready: false,
                    phase: String::new(),
                    healthy: None,
                    url: None,
                    attributes: Default::default(),
                    latency: None,
                    credentials: None,
                    realm: None,
                    retiring: false,
                },
                active: 0,
                global_cooldown: None,
                indexed: None,
                blocked_targets: Default::default(),
                errors: 0,
                digest: crate::rendezvous::proxy_digest(key),
                slots,
            },
        );
        self.placeholders.insert(id);
        id
    }

    /// Drops placeholders with nothing left to remember: no lease, no rest,
    /// no ended lease that may still be reported on.
    pub(super) fn drop_idle_placeholders(&mut self, now: Instant) {
        // Only placeholders are looked at: the sweep runs every second.
        let idle: Vec<(ProxyId, ObjectKey)> = self
            .placeholders
            .iter()
            .filter_map(|id| Some((*id, self.proxies.get(id)?)))
            .filter(|(_, e)| e.active == 0 && e.global_cooldown.is_none_or(|until| until <= now))
            .map(|(id, e)| (id, e.availability.key.clone()))
            .collect();
        let tallies_expired = self
            .restored_at
            .is_none_or(|at| now.saturating_duration_since(at) >= TALLY_GRACE);
        for (id, key) in idle {
            let resting = self.targets.values().any(|t| t.resting(id, now));
            let reportable = self.ended.values().any(|ended| ended.proxy == id);
            let tallied = self
                .proxies
                .get(&id)
                .is_some_and(|e| !e.blocked_targets.is_empty() || e.errors > 0);
            if resting || reportable || (tallied && !tallies_expired) {
                continue;
            }
            self.proxies.remove(&id);
            self.ids.remove(&key);
            self.placeholders.remove(&id);
            if tallied {
                // The journal keeps a tally until told the proxy is gone.
                self.note(LeaseChange::ProxyRemoved(key));
            }
        }
    }
}
