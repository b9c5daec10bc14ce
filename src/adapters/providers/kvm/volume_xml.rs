//! Storage volume XML: capacities always in bytes; overlays are qcow2 with
//! their base as backing store (a thin disk per VM over the cached image).

/// A volume created empty (`raw` seed, `qcow2`/`raw` base before upload).
pub fn plain_volume_xml(name: &str, format: &str, capacity_bytes: u64) -> String {
    format!(
        "<volume><name>{}</name><capacity unit=\"bytes\">{capacity_bytes}</capacity>\
         <target><format type=\"{format}\"/></target></volume>",
        quick_xml::escape::escape(name)
    )
}

/// A qcow2 overlay of `capacity_bytes` over the base at `backing_path`.
pub fn overlay_volume_xml(
    name: &str,
    capacity_bytes: u64,
    backing_path: &str,
    backing_format: &str,
) -> String {
    format!(
        "<volume><name>{}</name><capacity unit=\"bytes\">{capacity_bytes}</capacity>\
         <target><format type=\"qcow2\"/></target>\
         <backingStore><path>{}</path><format type=\"{backing_format}\"/></backingStore></volume>",
        quick_xml::escape::escape(name),
        quick_xml::escape::escape(backing_path)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_names_its_backing_store_and_sizes_in_bytes() {
        let xml = overlay_volume_xml(
            "proxy-a.qcow2",
            10 * 1024 * 1024 * 1024,
            "/pool/base-debian.qcow2",
            "qcow2",
        );
        let doc = roxmltree::Document::parse(&xml).unwrap();
        let root = doc.root_element();
        let get = |path: &[&str]| {
            let mut n = root;
            for p in path {
                n = n.children().find(|c| c.has_tag_name(*p)).unwrap();
            }
            n
        };
        assert_eq!(get(&["name"]).text(), Some("proxy-a.qcow2"));
        assert_eq!(
            (get(&["capacity"]).attribute("unit"), get(&["capacity"]).text()),
            (Some("bytes"), Some("10737418240"))
        );
        assert_eq!(get(&["target", "format"]).attribute("type"), Some("qcow2"));
        assert_eq!(
            get(&["backingStore", "path"]).text(),
            Some("/pool/base-debian.qcow2")
        );
        assert_eq!(get(&["backingStore", "format"]).attribute("type"), Some("qcow2"));
        let seed = plain_volume_xml("proxy-a-seed.iso", "raw", 376_832);
        assert!(roxmltree::Document::parse(&seed).is_ok());
        assert!(seed.contains("<capacity unit=\"bytes\">376832</capacity>"));
    }
}
