//! Outgoing addresses a pool's members were blocked on. A site that blocks
//! a proxy has usually banned its address: a successor given the same one
//! is blocked again at once. So an address a member was retired for blocks
//! on is quarantined for the blocked rest (the lease store's rest after a
//! `blocked` report: 20 × cooldown, at least ten minutes), counted from the
//! retirement, and no new member gets it while another address is free.
//!
//! The quarantine lives in the pool's status (durable with it: a restart
//! forgets nothing) and reaches the provider through an annotation on each
//! member, which the member's instance creation hands on
//! ([`crate::provider_contract::CreateRequest::quarantined`]). When every free
//! address is quarantined the provider still gives the one blocked longest
//! ago — the pool keeps serving — and the pool's `AddressesAvailable`
//! condition turns `False` naming the quarantine.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::provider_contract::QuarantinedAddress as Avoid;
use crate::resource::{Proxy, QUARANTINED_ADDRESSES_ANNOTATION, QuarantinedAddress, set_condition};

/// At most this many addresses are quarantined at once, the latest kept:
/// bounds the pool's status and each member's annotation.
pub const MAX_QUARANTINED: usize = 256;

/// The pool's condition about its outgoing addresses.
pub const ADDRESSES_AVAILABLE: &str = "AddressesAvailable";

/// A member retired for blocks: its name, the address it left from, and
/// when it was retired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedOn {
    pub member: String,
    pub address: IpAddr,
    pub since: Timestamp,
}

/// The quarantine after this turn: `previous` entries still running at
/// `now`, and one for each of `blocked` lasting `rest` from its retirement
/// (a later block on an address extends its quarantine, never shortens it).
pub fn quarantine(
    previous: &[QuarantinedAddress],
    blocked: &[BlockedOn],
    rest: Duration,
    now: Timestamp,
) -> Vec<QuarantinedAddress> {
    let mut by_address: BTreeMap<IpAddr, QuarantinedAddress> = BTreeMap::new();
    let mut keep = |address: IpAddr, entry: QuarantinedAddress| {
        if entry.until.0 <= now {
            return;
        }
        match by_address.get(&address) {
            Some(kept) if kept.until.0 >= entry.until.0 => {}
            _ => {
                by_address.insert(address, entry);
            }
        }
    };
    for entry in previous {
        // An entry not naming an address is nobody's to avoid.
        if let Ok(address) = entry.address.parse::<IpAddr>() {
            keep(address, entry.clone());
        }
    }
    for b in blocked {
        let until = b.since.checked_add(rest).unwrap_or(b.since);
        let entry = QuarantinedAddress {
            address: b.address.to_string(),
            member: b.member.clone(),
            since: Time(b.since),
            until: Time(until),
        };
        keep(b.address, entry);
    }
    let mut entries: Vec<QuarantinedAddress> = by_address.into_values().collect();
    if entries.len() > MAX_QUARANTINED {
        // The quarantines ending last are the ones that still matter longest.
        entries.sort_by_key(|e| std::cmp::Reverse(e.until.0));
        entries.truncate(MAX_QUARANTINED);
        entries.sort_by_key(|e| e.address.parse::<IpAddr>().ok());
    }
    entries
}

/// The annotation members carry: `<address>=<until>` for each entry still
/// running at `now`, comma-separated.
pub fn annotation_value(entries: &[QuarantinedAddress], now: Timestamp) -> String {
    entries
        .iter()
        .filter(|e| e.until.0 > now)
        .map(|e| format!("{}={}", e.address, e.until.0))
        .collect::<Vec<_>>()
        .join(",")
}

/// The entries of an annotation's value; unreadable ones are skipped (the
/// annotation is the operator's own, but anyone may edit it).
pub fn parse_annotation(value: &str) -> Vec<Avoid> {
    value
        .split(',')
        .filter_map(|part| {
            let (address, until) = part.trim().split_once('=')?;
            Some(Avoid {
                address: address.trim().parse().ok()?,
                until: until.trim().parse().ok()?,
            })
        })
        .collect()
}

/// The addresses `proxy`'s instance should not get, as its annotation says,
/// those still quarantined at `now`.
pub fn quarantined_of(proxy: &Proxy, now: Timestamp) -> Vec<Avoid> {
    let Some(value) = proxy
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(QUARANTINED_ADDRESSES_ANNOTATION))
    else {
        return Vec::new();
    };
    let mut avoid = parse_annotation(value);
    avoid.retain(|a| a.until > now);
    avoid
}

/// Whether `member`'s annotation misses a quarantine of `entries` (or has
/// it end earlier): it then gets the current annotation. Entries that
/// ended are not written away: the provider ignores them.
pub fn annotation_stale(member: &Proxy, entries: &[QuarantinedAddress], now: Timestamp) -> bool {
    let carried = quarantined_of(member, now);
    entries.iter().filter(|e| e.until.0 > now).any(|e| {
        let covered = |a: &Avoid| a.address.to_string() == e.address && a.until >= e.until.0;
        !carried.iter().any(covered)
    })
}

/// A member as the condition sees it: name, whether it is retiring, and
/// the address it leaves from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaving {
    pub member: String,
    pub retiring: bool,
    pub address: Option<IpAddr>,
}

/// Sets the pool's `AddressesAvailable` condition from the quarantine
/// (`entries`, all still running) and its `members`: `False`
/// (`AddressesExhausted`) while a serving member leaves from an address
/// quarantined after another member was blocked on it — it was given one
/// because no other was free; `True` (`Quarantined`) while addresses are
/// quarantined and new members got others; `True` (`NoneQuarantined`) once
/// the quarantine is over. A pool that never quarantined has no such
/// condition.
pub fn note_condition(
    conditions: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    entries: &[QuarantinedAddress],
    members: &[Leaving],
    generation: Option<i64>,
    now: Timestamp,
) {
    let known = conditions.iter().any(|c| c.type_ == ADDRESSES_AVAILABLE);
    if entries.is_empty() {
        if known {
            set_condition(
                conditions,
                ADDRESSES_AVAILABLE,
                true,
                "NoneQuarantined",
                "no outgoing address is quarantined",
                generation,
                Time(now),
            );
        }
        return;
    }
    let first_free = entries.iter().map(|e| e.until.0).min().unwrap_or(now);
    let round = |t: Timestamp| t.round(jiff::Unit::Second).unwrap_or(t);
    let count = entries.len();
    let reusing: Vec<(&Leaving, &QuarantinedAddress)> = members
        .iter()
        .filter(|m| !m.retiring)
        .filter_map(|m| {
            let address = m.address?.to_string();
            let entry = entries
                .iter()
                .find(|e| e.address == address && e.member != m.member)?;
            Some((m, entry))
        })
        .collect();
    let (status, reason, message) = match reusing.first() {
        Some((m, entry)) => (
            false,
            "AddressesExhausted",
            format!(
                "every free outgoing address was quarantined, so {} member(s) leave from quarantined ones \
                 ({} from {}, quarantined until {}); {count} address(es) quarantined after blocks, the first \
                 free again at {}: add addresses to outgoingAddresses",
                reusing.len(),
                m.member,
                entry.address,
                round(entry.until.0),
                round(first_free),
            ),
        ),
        None => (
            true,
            "Quarantined",
            format!(
                "{count} outgoing address(es) quarantined after blocks, the first free again at {}; \
                 new members get other addresses",
                round(first_free)
            ),
        ),
    };
    set_condition(
        conditions,
        ADDRESSES_AVAILABLE,
        status,
        reason,
        &message,
        generation,
        Time(now),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    const REST: Duration = Duration::from_secs(600);

    fn blocked(member: &str, address: &str, since: i64) -> BlockedOn {
        BlockedOn {
            member: member.into(),
            address: address.parse().unwrap(),
            since: at(since),
        }
    }

    #[test]
    fn a_block_quarantines_its_address_for_the_rest_and_a_later_one_extends_it() {
        let q = quarantine(&[], &[blocked("eu-a", "127.0.0.2", 10)], REST, at(10));
        assert_eq!(q.len(), 1);
        assert_eq!(
            (q[0].address.as_str(), q[0].member.as_str()),
            ("127.0.0.2", "eu-a")
        );
        assert_eq!((q[0].since.0, q[0].until.0), (at(10), at(610)));
        // The same retirement seen again changes nothing; a later block extends.
        assert_eq!(
            quarantine(&q, &[blocked("eu-a", "127.0.0.2", 10)], REST, at(20)),
            q
        );
        let later = quarantine(&q, &[blocked("eu-b", "127.0.0.2", 100)], REST, at(100));
        assert_eq!((later[0].member.as_str(), later[0].until.0), ("eu-b", at(700)));
        assert_eq!(
            quarantine(&later, &[blocked("eu-a", "127.0.0.2", 10)], REST, at(101)),
            later
        );
        // Over at its end.
        assert!(quarantine(&later, &[], REST, at(700)).is_empty());
    }

    #[test]
    fn entries_are_bounded_keeping_the_latest() {
        let many: Vec<BlockedOn> = (0..MAX_QUARANTINED + 10)
            .map(|i| {
                blocked(
                    &format!("m{i}"),
                    &format!("10.0.{}.{}", i / 200, i % 200),
                    i as i64,
                )
            })
            .collect();
        let q = quarantine(&[], &many, REST, at(300));
        assert_eq!(q.len(), MAX_QUARANTINED);
        assert!(q.iter().all(|e| e.since.0 >= at(10)), "the ten oldest went");
    }

    #[test]
    fn the_annotation_round_trips_and_skips_what_it_cannot_read() {
        let q = quarantine(
            &[],
            &[blocked("a", "127.0.0.2", 0), blocked("b", "2001:db8::7", 5)],
            REST,
            at(5),
        );
        let value = annotation_value(&q, at(6));
        assert_eq!(
            parse_annotation(&value),
            [
                Avoid {
                    address: "127.0.0.2".parse().unwrap(),
                    until: at(600)
                },
                Avoid {
                    address: "2001:db8::7".parse().unwrap(),
                    until: at(605)
                },
            ]
        );
        assert_eq!(annotation_value(&q, at(601)), format!("2001:db8::7={}", at(605)));
        assert_eq!(parse_annotation("junk, 127.0.0.3=yesterday,=,"), []);
    }

    #[test]
    fn a_member_missing_a_running_quarantine_gets_the_annotation_again() {
        let pool_member = |value: Option<String>| {
            let mut p = Proxy::new(
                "eu-x",
                serde_json::from_value(serde_json::json!({"mode": "Managed", "provider": "local"})).unwrap(),
            );
            if let Some(v) = value {
                p.metadata.annotations = Some([(QUARANTINED_ADDRESSES_ANNOTATION.to_owned(), v)].into());
            }
            p
        };
        let q = quarantine(&[], &[blocked("a", "127.0.0.2", 0)], REST, at(0));
        assert!(annotation_stale(&pool_member(None), &q, at(1)));
        let current = pool_member(Some(annotation_value(&q, at(1))));
        assert!(!annotation_stale(&current, &q, at(1)));
        assert_eq!(quarantined_of(&current, at(1)).len(), 1);
        assert!(quarantined_of(&current, at(600)).is_empty(), "over");
        let extended = quarantine(&q, &[blocked("b", "127.0.0.2", 50)], REST, at(50));
        assert!(annotation_stale(&current, &extended, at(50)), "ends later now");
        assert!(
            !annotation_stale(&pool_member(None), &[], at(1)),
            "nothing to carry"
        );
    }

    #[test]
    fn the_condition_says_whether_new_members_got_unquarantined_addresses() {
        let mut conditions = Vec::new();
        let leaving = |member: &str, address: &str| Leaving {
            member: member.into(),
            retiring: false,
            address: address.parse().ok(),
        };
        note_condition(&mut conditions, &[], &[leaving("eu-a", "127.0.0.2")], None, at(0));
        assert!(conditions.is_empty(), "never quarantined: no condition");

        let q = quarantine(&[], &[blocked("eu-a", "127.0.0.2", 0)], REST, at(0));
        let blocked_one = Leaving {
            retiring: true,
            ..leaving("eu-a", "127.0.0.2")
        };
        note_condition(
            &mut conditions,
            &q,
            &[blocked_one.clone(), leaving("eu-b", "127.0.0.3")],
            None,
            at(1),
        );
        assert_eq!(
            (conditions[0].status.as_str(), conditions[0].reason.as_str()),
            ("True", "Quarantined")
        );
        assert!(
            conditions[0]
                .message
                .starts_with("1 outgoing address(es) quarantined"),
            "{}",
            conditions[0].message
        );

        note_condition(
            &mut conditions,
            &q,
            &[blocked_one, leaving("eu-c", "127.0.0.2")],
            None,
            at(2),
        );
        assert_eq!(
            (conditions[0].status.as_str(), conditions[0].reason.as_str()),
            ("False", "AddressesExhausted")
        );
        let message = &conditions[0].message;
        assert!(
            message.contains("eu-c from 127.0.0.2") && message.contains("1 address(es) quarantined"),
            "{message}"
        );

        note_condition(
            &mut conditions,
            &[],
            &[leaving("eu-c", "127.0.0.2")],
            None,
            at(700),
        );
        assert_eq!(
            (conditions[0].status.as_str(), conditions[0].reason.as_str()),
            ("True", "NoneQuarantined")
        );
    }
}
