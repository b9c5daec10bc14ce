//! Who a gateway request is: the identity its proxy password (a crawler
//! token) proves, never what its username says. The username still
//! carries the session and choice parameters ([`super::username`]); its
//! first word is a free label the gateway no longer uses for anything
//! (kept so that usernames written for earlier versions, and vendor-style
//! ones like `user-session-abc`, keep working).
//!
//! | gateway      | credentials presented      | from `clientNetworks` | answer                  |
//! |--------------|----------------------------|-----------------------|-------------------------|
//! | open         | any or none                | either                | `anonymous`             |
//! | with tokens  | a known token              | either                | the token's identity    |
//! | with tokens  | wrong, or not `Basic`      | either                | `407`                   |
//! | with tokens  | none                       | yes                   | `anonymous`             |
//! | with tokens  | none                       | no                    | `407`                   |

use std::net::IpAddr;

use super::{GatewayError, Parameters, basic_credentials, username};
use crate::domain::destinations::IpNet;
use crate::domain::identity::{ANONYMOUS_IDENTITY, Identities};

/// An admitted request: who it is and what its username asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identified {
    /// The identity: lease owner, sticky-session and rate-limit key.
    pub identity: String,
    pub params: Parameters,
}

impl Identified {
    /// The key its rate is limited by: the identity, or for an anonymous
    /// client (nothing else tells them apart) its address.
    pub fn rate_key(&self, peer: IpAddr) -> String {
        if self.identity == ANONYMOUS_IDENTITY {
            format!("{ANONYMOUS_IDENTITY}@{peer}")
        } else {
            self.identity.clone()
        }
    }
}

/// Admits a request presenting `presented` (its `Proxy-Authorization`)
/// from `peer`, or refuses it (see the module's table).
pub fn identify(
    identities: &Identities,
    presented: Option<&[u8]>,
    peer: IpAddr,
    client_networks: &[IpNet],
) -> Result<Identified, GatewayError> {
    let credentials = presented.map(basic_credentials);
    let identity = if identities.is_open() {
        ANONYMOUS_IDENTITY.to_owned()
    } else {
        match &credentials {
            Some(Some((_, password))) => identities
                .identify(password)
                .map(str::to_owned)
                .ok_or(GatewayError::AuthenticationRequired)?,
            // Presented but not Basic: wrong credentials, wherever from.
            Some(None) => return Err(GatewayError::AuthenticationRequired),
            None if client_networks.iter().any(|n| n.contains(&peer)) => ANONYMOUS_IDENTITY.to_owned(),
            None => return Err(GatewayError::AuthenticationRequired),
        }
    };
    let user = credentials
        .flatten()
        .map(|(user, _)| String::from_utf8_lossy(&user).into_owned())
        .unwrap_or_default();
    let params = username::parse(&user)?;
    Ok(Identified { identity, params })
}

#[cfg(test)]
mod tests {
    use data_encoding::BASE64;

    use super::*;

    fn basic(pair: &str) -> Vec<u8> {
        format!("Basic {}", BASE64.encode(pair.as_bytes())).into_bytes()
    }

    #[test]
    fn the_token_names_the_client_never_the_username() {
        let tokens = Identities::build(
            vec![
                ("team-a".into(), b"token-a".to_vec()),
                ("team-b".into(), b"token-b".to_vec()),
            ],
            Some("legacy"),
            None,
            true,
        )
        .unwrap();
        let open = Identities::open();
        let nets: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let inside: IpAddr = "10.1.2.3".parse().unwrap();
        let outside: IpAddr = "192.0.2.1".parse().unwrap();
        let a = basic("team-b-session-s1:token-a");
        let b = basic("bob1:token-b");
        let legacy = basic(":legacy");
        let wrong = basic("team-a:nope");
        let no_colon = basic("token-a");
        // (identities, header, peer, identity or None for 407)
        type Row<'a> = (&'a Identities, Option<&'a [u8]>, IpAddr, Option<&'a str>);
        let rows: [Row; 13] = [
            (&tokens, Some(&a), outside, Some("team-a")),
            (&tokens, Some(&b), outside, Some("team-b")),
            (&tokens, Some(&legacy), outside, Some("default")),
            (&tokens, Some(&a), inside, Some("team-a")),
            (&tokens, Some(&wrong), outside, None),
            (&tokens, Some(&wrong), inside, None),
            (&tokens, Some(&no_colon), outside, None),
            (&tokens, Some(b"Bearer token-a"), inside, None),
            (&tokens, None, inside, Some("anonymous")),
            (&tokens, None, outside, None),
            (&open, None, outside, Some("anonymous")),
            (&open, Some(&wrong), outside, Some("anonymous")),
            (&open, Some(b"Bearer x"), outside, Some("anonymous")),
        ];
        for (identities, header, peer, expected) in rows {
            let got = identify(identities, header, peer, &nets);
            match expected {
                Some(name) => assert_eq!(got.unwrap().identity, name, "{header:?} from {peer}"),
                None => assert!(
                    matches!(got, Err(GatewayError::AuthenticationRequired)),
                    "{header:?} from {peer}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn the_username_still_carries_parameters() {
        let tokens = Identities::build(vec![("team-a".into(), b"t".to_vec())], None, None, true).unwrap();
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let got = identify(&tokens, Some(&basic("label-session-s1-sesstime-5:t")), peer, &[]).unwrap();
        assert_eq!(got.identity, "team-a");
        assert_eq!(got.params.session.as_deref(), Some("s1"));
        assert_eq!(got.rate_key(peer), "team-a");
        let bad = identify(&tokens, Some(&basic("c-sesstime-0:t")), peer, &[]);
        assert!(matches!(bad, Err(GatewayError::Username(_))), "{bad:?}");
        // Bad credentials are refused before the username is looked at.
        let both = identify(&tokens, Some(&basic("c-sesstime-0:x")), peer, &[]);
        assert!(matches!(both, Err(GatewayError::AuthenticationRequired)));
        let anonymous = identify(&Identities::open(), None, peer, &[]).unwrap();
        assert_eq!(anonymous.rate_key(peer), "anonymous@127.0.0.1");
    }
}
