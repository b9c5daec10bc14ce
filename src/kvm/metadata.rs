//! The operator's mark on a domain: libvirt has no labels, so the domain's
//! `<metadata>` carries an element in the operator's own namespace with the
//! managed flag, the owning Proxy's UID and the creation time. libvirt
//! returns it without prefix or namespace declaration (real hosts), so the
//! parser matches local names only.

use jiff::Timestamp;
use quick_xml::events::Event;

/// Namespace URI of the metadata element.
pub const METADATA_URI: &str = "https://crawl.example.com/egress-proxies-operator/v1";
/// Prefix used when writing it.
pub const METADATA_PREFIX: &str = "epo";

/// What the operator records on a domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceMetadata {
    pub managed: bool,
    pub uid: String,
    pub created_at: Timestamp,
}

/// The element's inner XML (for `virDomainSetMetadata`, which adds the namespace).
pub fn to_xml(meta: &InstanceMetadata) -> String {
    format!(
        "<instance><managed>{}</managed><uid>{}</uid><createdAt>{}</createdAt></instance>",
        meta.managed,
        quick_xml::escape::escape(meta.uid.as_str()),
        meta.created_at
    )
}

/// Parses the element as libvirt returns it (prefix and namespace optional).
pub fn parse(xml: &str) -> Option<InstanceMetadata> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let (mut managed, mut uid, mut created) = (None, None, None);
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
                match current.take().as_deref() {
                    Some("managed") => managed = Some(text.trim() == "true"),
                    Some("uid") => uid = Some(text.trim().to_owned()),
                    Some("createdAt") => created = text.trim().parse::<Timestamp>().ok(),
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> InstanceMetadata {
        InstanceMetadata {
            managed: true,
            uid: "0b7d3c1e-1111-4222-8333-444455556666".into(),
            created_at: "2026-11-30T01:02:03Z".parse().unwrap(),
        }
    }

    #[test]
    fn round_trips_and_reads_what_libvirt_returns() {
        assert_eq!(parse(&to_xml(&sample())), Some(sample()));
        // As libvirt 11.6 returns it: no prefix, no xmlns.
        let bare = "<instance><managed>true</managed><uid>0b7d3c1e-1111-4222-8333-444455556666</uid>\
                    <createdAt>2026-11-30T01:02:03Z</createdAt></instance>";
        assert_eq!(parse(bare), Some(sample()));
        // With a prefix and declaration, as written.
        let prefixed = format!(
            "<epo:instance xmlns:epo=\"{METADATA_URI}\"><epo:managed>true</epo:managed>\
             <epo:uid>0b7d3c1e-1111-4222-8333-444455556666</epo:uid><epo:createdAt>2026-11-30T01:02:03Z</epo:createdAt></epo:instance>"
        );
        assert_eq!(parse(&prefixed), Some(sample()));
        assert_eq!(
            parse("<instance><managed>true</managed></instance>"),
            None,
            "incomplete marks are not ours"
        );
        assert_eq!(parse("not xml <"), None);
    }
}
