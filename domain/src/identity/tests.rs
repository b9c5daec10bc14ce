use super::*;

fn file(name: &str, token: &str) -> (String, Vec<u8>) {
    (name.to_owned(), token.as_bytes().to_vec())
}

#[test]
fn names_are_dns_label_like() {
    for (name, ok) in [
        ("team-a", true),
        ("a", true),
        ("crawler7", true),
        (&"a".repeat(64), true),
        (&"a".repeat(65), false),
        ("", false),
        ("Team-A", false),
        ("-a", false),
        ("a-", false),
        ("a_b", false),
        ("a.b", false),
        ("..data", false),
    ] {
        assert_eq!(valid_name(name), ok, "{name:?}");
    }
}

#[test]
fn each_file_is_an_identity_and_discovery_token_is_default() {
    let ids = Identities::build(
        vec![file("team-b", "tb\n"), file("team-a", "  ta ")],
        Some("legacy"),
        Some("reader"),
        true,
    )
    .unwrap();
    assert_eq!(ids.names().collect::<Vec<_>>(), ["default", "team-a", "team-b"]);
    assert_eq!(ids.identify(b"ta"), Some("team-a"), "content is trimmed");
    assert_eq!(ids.identify(b"tb"), Some("team-b"));
    assert_eq!(ids.identify(b"legacy"), Some("default"));
    assert_eq!(ids.identify(b"reader"), None);
    assert_eq!(ids.identify(b"t"), None, "a prefix is no token");
    assert_eq!(ids.identify(b""), None);
    assert!(!ids.is_open());
    assert_eq!(ids.authenticate(None), None);
    assert_eq!(ids.authenticate(Some(b"tb")), Some("team-b"));
}

#[test]
fn without_tokens_everyone_is_anonymous_unless_a_directory_is_configured() {
    let open = Identities::build(vec![], None, None, false).unwrap();
    assert!(open.is_open());
    assert_eq!(open.authenticate(None), Some(ANONYMOUS_IDENTITY));
    assert_eq!(open.authenticate(Some(b"anything")), Some(ANONYMOUS_IDENTITY));
    let empty_dir = Identities::build(vec![], None, None, true).unwrap();
    assert!(
        !empty_dir.is_open(),
        "an emptied Secret must not open the gateway"
    );
    assert_eq!(empty_dir.authenticate(None), None);
    assert_eq!(empty_dir.authenticate(Some(b"")), None);
    let legacy_only = Identities::build(vec![], Some(""), None, false).unwrap();
    assert!(legacy_only.is_open(), "an empty DISCOVERY_TOKEN is unset");
}

#[test]
fn mistakes_name_the_file() {
    let fail = |files: Vec<(String, Vec<u8>)>, legacy: Option<&str>| {
        Identities::build(files, legacy, Some("reader"), true).unwrap_err()
    };
    for (error, expected) in [
        (
            fail(vec![file("Team", "t")], None),
            IdentityError::BadName { file: "Team".into() },
        ),
        (
            fail(vec![file("anonymous", "t")], None),
            IdentityError::Reserved {
                file: "anonymous".into(),
            },
        ),
        (
            fail(vec![file("default", "t")], Some("legacy")),
            IdentityError::DefaultTaken {
                file: "default".into(),
            },
        ),
        (
            fail(vec![file("a", " \n")], None),
            IdentityError::EmptyToken { file: "a".into() },
        ),
        (
            fail(vec![file("a", "same"), file("b", "same\n")], None),
            IdentityError::SameToken {
                file: "b".into(),
                other: "a".into(),
            },
        ),
        (
            fail(vec![file("a", "legacy")], Some("legacy")),
            IdentityError::SameToken {
                file: "a".into(),
                other: "DISCOVERY_TOKEN".into(),
            },
        ),
        (
            fail(vec![file("a", "reader")], None),
            IdentityError::ReadToken { file: "a".into() },
        ),
        (
            fail(vec![("a".into(), vec![0xff, 0xfe])], None),
            IdentityError::NotText { file: "a".into() },
        ),
    ] {
        assert_eq!(error, expected);
        assert!(error.to_string().contains('"'), "{error}");
    }
    // A file named `default` is fine without DISCOVERY_TOKEN.
    let ids = Identities::build(vec![file("default", "d")], None, None, true).unwrap();
    assert_eq!(ids.identify(b"d"), Some("default"));
}

#[test]
fn debug_output_never_shows_a_token() {
    let ids = Identities::build(vec![file("team-a", "s3cret-token")], None, None, true).unwrap();
    let shown = format!("{ids:?}");
    assert!(shown.contains("team-a") && !shown.contains("s3cret"), "{shown}");
}

#[test]
fn a_shared_set_is_replaced_whole() {
    let shared = SharedIdentities::new(Identities::open());
    assert!(shared.current().is_open());
    let held = shared.current();
    shared.replace(Identities::build(vec![file("a", "t")], None, None, true).unwrap());
    assert!(held.is_open(), "a request keeps the set it started with");
    assert_eq!(shared.current().identify(b"t"), Some("a"));
}
