//! Who may release, report on or renew a lease: the gateway its own
//! leases (for its client), an API lease only the identity that took it.
//! The identity a gateway lease serves may also report on it (a block seen
//! inside its own tunnel), but never release or renew it: only the gateway
//! ends what it holds. Anyone else is refused ([`NotOwner`], `403
//! not_owner`), so nobody can end or rest a lease someone else still uses,
//! and the capacity accounting cannot be overbooked from outside.

use super::is_gateway_client;

/// Who asks to act on a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The gateway, in process, for one of its connections.
    Gateway,
    /// An API client, by its identity (`crate::identity`).
    Identity(String),
}

/// What a caller asks to do with a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Release,
    Report,
    Renew,
}

/// The lease belongs to someone else.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotOwner {
    #[error(
        "lease {0} is held by the gateway for one of its connections; only the gateway releases or renews it, and only the identity it serves reports on it"
    )]
    GatewayLease(String),
    #[error(
        "lease {0} was taken by another identity; only the identity that took it may release, report on or renew it"
    )]
    OtherIdentity(String),
}

/// Whether `caller` may `act` on a lease taken for `client` by `owner`.
/// A lease without an owner was taken before leases had owners (a journal
/// written by an older version): any API identity may act on it, as every
/// client could then; it expires within the longest TTL anyway.
pub fn may_act(client: Option<&str>, owner: Option<&str>, caller: &Caller, act: Act) -> bool {
    let gateway_lease = client.is_some_and(is_gateway_client);
    match caller {
        Caller::Gateway => gateway_lease,
        Caller::Identity(who) if gateway_lease => act == Act::Report && owner == Some(who.as_str()),
        Caller::Identity(who) => owner.is_none_or(|owner| owner == who),
    }
}

/// [`may_act`] as an error naming the lease.
pub fn check(
    id: &str,
    client: Option<&str>,
    owner: Option<&str>,
    caller: &Caller,
    act: Act,
) -> Result<(), NotOwner> {
    if may_act(client, owner, caller, act) {
        return Ok(());
    }
    if client.is_some_and(is_gateway_client) {
        Err(NotOwner::GatewayLease(id.to_owned()))
    } else {
        Err(NotOwner::OtherIdentity(id.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owner_acts_on_a_lease() {
        let a = Caller::Identity("team-a".into());
        let b = Caller::Identity("team-b".into());
        let gw = Caller::Gateway;
        /// (lease client, lease owner, caller, may release and renew, may report)
        type Row<'a> = (Option<&'a str>, Option<&'a str>, &'a Caller, bool, bool);
        #[rustfmt::skip]
        let rows: [Row; 13] = [
            // An API lease: its owner only.
            (Some("spider"), Some("team-a"), &a, true, true),
            (Some("spider"), Some("team-a"), &b, false, false),
            (None, Some("team-a"), &b, false, false),
            (None, Some("team-a"), &a, true, true),
            // The gateway acts on its own leases only.
            (None, Some("team-a"), &gw, false, false),
            // A gateway lease: the gateway ends it; the identity it serves
            // may report a block seen inside its tunnel, nobody else.
            (Some("gateway"), Some("team-a"), &a, false, true),
            (Some("gateway/team-a"), Some("team-a"), &a, false, true),
            (Some("gateway/team-a"), Some("team-a"), &b, false, false),
            (Some("gateway/team-a"), Some("team-a"), &gw, true, true),
            (Some("gateway"), None, &gw, true, true),
            (Some("gateway"), None, &a, false, false),
            // Taken before owners existed: any identity, never the gateway.
            (Some("spider"), None, &b, true, true),
            (None, None, &gw, false, false),
        ];
        for (client, owner, caller, ends, reports) in rows {
            for (act, allowed) in [(Act::Release, ends), (Act::Renew, ends), (Act::Report, reports)] {
                assert_eq!(
                    may_act(client, owner, caller, act),
                    allowed,
                    "{act:?} of {client:?} owned by {owner:?}, asked by {caller:?}"
                );
            }
        }
    }

    #[test]
    fn refusals_say_whose_lease_it_is() {
        let b = Caller::Identity("team-b".into());
        let gateway = check("l1", Some("gateway/x"), Some("x"), &b, Act::Release).unwrap_err();
        assert!(gateway.to_string().contains("gateway"), "{gateway}");
        let other = check("l2", None, Some("team-a"), &b, Act::Report).unwrap_err();
        assert!(other.to_string().contains("another identity"), "{other}");
        assert!(check("l3", None, Some("team-b"), &b, Act::Renew).is_ok());
    }
}
