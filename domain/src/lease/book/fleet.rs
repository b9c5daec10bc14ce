//! The book among other replicas' books: the rests and tallies it makes go
//! out as [`FleetChange`]s (rests under [`MIN_SHARED_REST`] stay local),
//! and those of other replicas come in through [`LeaseBook::apply_remote`]
//! with set semantics, neither journaled (the replica that made a change
//! journals it) nor passed on again.

use std::time::Instant;

use super::{LeaseBook, MAX_BLOCKED_TARGETS};
use crate::lease::fleet::{FleetChange, MIN_SHARED_REST};
use crate::lease::journal::{LeaseChange, ProxyTally};
use crate::resource::ObjectKey;

impl LeaseBook {
    /// From now on, every rest and tally other replicas must learn is kept
    /// for [`Self::take_fleet_changes`].
    pub fn share_fleet_changes(&mut self) {
        self.fleet.get_or_insert_with(Vec::new);
    }

    /// The fleet changes made since the last call, oldest first (feed them
    /// to the replica's [`crate::lease::fleet::Outbox`]).
    pub fn take_fleet_changes(&mut self) -> Vec<FleetChange> {
        self.fleet.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Applies another replica's change: a rest ends no earlier than it
    /// says, blocked targets are united, errors the larger. Idempotent; a
    /// proxy not known yet is kept as a placeholder (unlisted, never
    /// leased) until its availability arrives.
    pub fn apply_remote(&mut self, change: &FleetChange, now: Instant) {
        let journaling = self.changes.take();
        let sharing = self.fleet.take();
        match change {
            FleetChange::TargetRest {
                target,
                proxy,
                remaining,
            } => {
                // A target never seen takes room as a lease's would; with
                // the table full of running rests, the rest is not kept.
                let room = self.targets.contains_key(target) || self.make_room_for_target(now).is_ok();
                if !remaining.is_zero() && room {
                    let id = self.placeholder(proxy);
                    self.rest_for_target(target, id, now + *remaining, now);
                }
            }
            FleetChange::ProxyRest { proxy, remaining } => {
                if !remaining.is_zero() {
                    let id = self.placeholder(proxy);
                    self.rest_everywhere(id, now + *remaining, now);
                    self.reindex(id, now);
                }
            }
            FleetChange::Tally(tally) => {
                let id = self.placeholder(&tally.proxy);
                if let Some(entry) = self.proxies.get_mut(&id) {
                    for target in &tally.blocked_targets {
                        if entry.blocked_targets.len() >= MAX_BLOCKED_TARGETS {
                            break;
                        }
                        entry.blocked_targets.insert(*target);
                    }
                    entry.errors = entry.errors.max(tally.errors);
                }
            }
        }
        self.changes = journaling;
        self.fleet = sharing;
    }

    /// A rest for `target` (none: every target) other replicas must learn,
    /// unless it is too short to matter to them.
    pub(super) fn tell_fleet_rest(
        &mut self,
        target: Option<&str>,
        proxy: &ObjectKey,
        until: Instant,
        now: Instant,
    ) {
        let Some(fleet) = self.fleet.as_mut() else {
            return;
        };
        let remaining = until.saturating_duration_since(now);
        if remaining < MIN_SHARED_REST {
            return;
        }
        fleet.push(match target {
            Some(target) => FleetChange::TargetRest {
                target: target.to_owned(),
                proxy: proxy.clone(),
                remaining,
            },
            None => FleetChange::ProxyRest {
                proxy: proxy.clone(),
                remaining,
            },
        });
    }

    /// A tally change (a new blocking target, errors counted) as other
    /// replicas learn it.
    pub(super) fn tell_fleet_tally(&mut self, change: &LeaseChange) {
        let Some(fleet) = self.fleet.as_mut() else {
            return;
        };
        let tally = match change {
            LeaseChange::BlockedBy { proxy, target } => ProxyTally {
                proxy: proxy.clone(),
                blocked_targets: vec![*target],
                errors: 0,
            },
            LeaseChange::Errors { proxy, count } => ProxyTally {
                proxy: proxy.clone(),
                blocked_targets: Vec::new(),
                errors: *count,
            },
            _ => return,
        };
        fleet.push(FleetChange::Tally(tally));
    }
}
