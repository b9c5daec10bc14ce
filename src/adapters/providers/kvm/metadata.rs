//! The operator's mark on a domain: libvirt has no labels, so the domain's
//! `<metadata>` carries an element in the operator's own namespace with the
//! managed flag, the owning Proxy's UID and namespace, the installation that
//! made it, a released flag (skip-cleanup) and the creation time. libvirt
//! returns it without prefix or namespace declaration (real hosts), so the
//! parser matches local names only. Elements written by earlier versions
//! lack namespace, installation and released: they parse, with those unset.

use jiff::Timestamp;
use quick_xml::events::Event;

/// Namespace URI of the metadata element.
pub const METADATA_URI: &str = "https://crawl.example.com/egress-proxies-operator/v1";
/// Prefix used when writing it.
pub const METADATA_PREFIX: &str = "epo";

/// What the operator records on a domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceMetadata {
    /// Listed by orphan GC (false once released).
    pub managed: bool,
    pub uid: String,
    pub created_at: Timestamp,
    /// Namespace of the owning Proxy.
    pub namespace: Option<String>,
    /// The installation that created it; `None` from earlier versions.
    pub installation: Option<String>,
    /// Released with skip-cleanup: left to its admin.
    pub released: bool,
}

impl InstanceMetadata {
    /// The same mark, released: no GC of any installation or version lists it.
    pub fn released(&self) -> Self {
        Self {
            managed: false,
            released: true,
            ..self.clone()
        }
    }

    /// The owner this mark names.
    pub fn ownership(&self) -> crate::domain::provider_contract::Ownership {
        crate::domain::provider_contract::Ownership {
            uid: Some(self.uid.clone()),
            namespace: self.namespace.clone(),
            installation: self.installation.clone(),
            released: self.released,
        }
    }

    /// The child elements in writing order, as (local name, text); absent
    /// optional fields are left out rather than written empty.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![("managed", self.managed.to_string()), ("uid", self.uid.clone())];
        if let Some(ns) = &self.namespace {
            out.push(("namespace", ns.clone()));
        }
        if let Some(i) = &self.installation {
            out.push(("installation", i.clone()));
        }
        out.push(("released", self.released.to_string()));
        out.push(("createdAt", self.created_at.to_string()));
        out
    }
}

/// The element's inner XML (for `virDomainSetMetadata`, which adds the namespace).
pub fn to_xml(meta: &InstanceMetadata) -> String {
    let mut out = String::from("<instance>");
    for (name, value) in meta.fields() {
        out.push_str(&format!(
            "<{name}>{}</{name}>",
            quick_xml::escape::escape(value.as_str())
        ));
    }
    out.push_str("</instance>");
    out
}

/// Parses the element as libvirt returns it (prefix and namespace optional).
pub fn parse(xml: &str) -> Option<InstanceMetadata> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let (mut managed, mut uid, mut created) = (None, None, None);
    let (mut namespace, mut installation, mut released) = (None, None, false);
    let mut current: Option<String> = None;
    let mut text = String::new();
    loop {
        match reader.read_event().ok()? {
            Event::Start(e) => {
                current = Some(e.local_name().into_inner().to_owned());
                text.clear();
            }
            Event::Text(t) => text.push_str(&t.into_inner()),
            // Entities arrive as separate events: `&lt;` and friends, `&#60;`.
            Event::GeneralRef(r) => {
                if let Some(c) = r.resolve_char_ref().ok()? {
                    text.push(c);
                } else {
                    text.push_str(quick_xml::escape::resolve_predefined_entity(&r.into_inner())?);
                }
            }
            Event::End(_) => {
                let value = text.trim();
                match current.take().as_deref() {
                    Some("managed") => managed = Some(value == "true"),
                    Some("uid") => uid = Some(value.to_owned()),
                    Some("createdAt") => created = value.parse::<Timestamp>().ok(),
                    // Empty text is as good as absent (a hand edit).
                    Some("namespace") => namespace = (!value.is_empty()).then(|| value.to_owned()),
                    Some("installation") => installation = (!value.is_empty()).then(|| value.to_owned()),
                    Some("released") => released = value == "true",
                    _ => {}
                }
                text.clear();
            }
            Event::Eof => break,
            _ => {}
        }
    }
    Some(InstanceMetadata {
        managed: managed?,
        uid: uid?,
        created_at: created?,
        namespace,
        installation,
        released,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mark as an earlier version wrote it: managed, uid, createdAt only.
    fn earlier() -> InstanceMetadata {
        InstanceMetadata {
            managed: true,
            uid: "0b7d3c1e-1111-4222-8333-444455556666".into(),
            created_at: "2026-11-30T01:02:03Z".parse().unwrap(),
            namespace: None,
            installation: None,
            released: false,
        }
    }

    fn sample() -> InstanceMetadata {
        InstanceMetadata {
            namespace: Some("crawl".into()),
            installation: Some("prod-eu-1".into()),
            ..earlier()
        }
    }

    #[test]
    fn round_trips_and_reads_what_libvirt_returns() {
        assert_eq!(parse(&to_xml(&sample())), Some(sample()));
        assert_eq!(parse(&to_xml(&earlier())), Some(earlier()));
        let released = sample().released();
        assert_eq!(parse(&to_xml(&released)), Some(released.clone()));
        assert!(!released.managed && released.released);
        assert_eq!(
            (
                released.uid,
                released.namespace,
                released.installation,
                released.created_at
            ),
            (
                sample().uid,
                sample().namespace,
                sample().installation,
                sample().created_at
            ),
            "releasing keeps who made it and when"
        );
        // As libvirt 11.6 returns it: no prefix, no xmlns.
        let bare = "<instance><managed>true</managed><uid>0b7d3c1e-1111-4222-8333-444455556666</uid>\
                    <namespace>crawl</namespace><installation>prod-eu-1</installation><released>false</released>\
                    <createdAt>2026-11-30T01:02:03Z</createdAt></instance>";
        assert_eq!(parse(bare), Some(sample()));
        // With a prefix and declaration, as written.
        let prefixed = format!(
            "<epo:instance xmlns:epo=\"{METADATA_URI}\"><epo:managed>true</epo:managed>\
             <epo:uid>0b7d3c1e-1111-4222-8333-444455556666</epo:uid><epo:namespace>crawl</epo:namespace>\
             <epo:installation>prod-eu-1</epo:installation><epo:createdAt>2026-11-30T01:02:03Z</epo:createdAt></epo:instance>"
        );
        assert_eq!(parse(&prefixed), Some(sample()));
        assert_eq!(
            parse("<instance><managed>true</managed></instance>"),
            None,
            "incomplete marks are not ours"
        );
        assert_eq!(parse("not xml <"), None);
    }

    #[test]
    fn marks_of_earlier_versions_still_parse_untagged() {
        // Exactly what the previous version wrote and libvirt returns for it.
        let old = "<instance><managed>true</managed><uid>0b7d3c1e-1111-4222-8333-444455556666</uid>\
                   <createdAt>2026-11-30T01:02:03Z</createdAt></instance>";
        let parsed = parse(old).unwrap();
        assert_eq!(parsed, earlier());
        let owner = parsed.ownership();
        assert_eq!(owner.installation, None, "untagged: no GC reaps it");
        assert_eq!(owner.namespace, None);
        assert!(!owner.released);
        // Elements this version does not know (a later one's) are ignored.
        let later = "<instance><managed>true</managed><uid>u</uid><createdAt>2026-11-30T01:02:03Z</createdAt>\
                     <installation>a</installation><zone>z</zone></instance>";
        assert_eq!(parse(later).map(|m| m.installation), Some(Some("a".into())));
        // Empty optional elements read as absent.
        let empty = "<instance><managed>true</managed><uid>u</uid><namespace/><installation> </installation>\
                     <createdAt>2026-11-30T01:02:03Z</createdAt></instance>";
        let parsed = parse(empty).unwrap();
        assert_eq!((parsed.namespace, parsed.installation), (None, None));
    }

    #[test]
    fn fields_are_escaped_and_ownership_is_complete() {
        let odd = InstanceMetadata {
            uid: "u<&>\"'".into(),
            namespace: Some("n&s".into()),
            ..sample()
        };
        let xml = to_xml(&odd);
        assert!(!xml.contains("u<&"), "{xml}");
        assert_eq!(parse(&xml), Some(odd.clone()));
        let owner = odd.released().ownership();
        assert_eq!(owner.uid.as_deref(), Some("u<&>\"'"));
        assert_eq!(owner.namespace.as_deref(), Some("n&s"));
        assert_eq!(owner.installation.as_deref(), Some("prod-eu-1"));
        assert!(owner.released);
    }
}
