//! The resources the fake serves.

/// One resource type.
#[derive(Debug)]
pub struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Has a status subresource (and a spec/status split with `generation`).
    pub status: bool,
    /// Has the scale subresource over `.spec.replicas`, `.status.replicas`
    /// and `.status.selector`.
    pub scale: bool,
}

impl Kind {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

pub const KINDS: &[Kind] = &[
    Kind {
        group: "",
        version: "v1",
        plural: "secrets",
        kind: "Secret",
        namespaced: true,
        status: false,
        scale: false,
    },
    Kind {
        group: "",
        version: "v1",
        plural: "configmaps",
        kind: "ConfigMap",
        namespaced: true,
        status: false,
        scale: false,
    },
    Kind {
        group: "",
        version: "v1",
        plural: "pods",
        kind: "Pod",
        namespaced: true,
        status: true,
        scale: false,
    },
    Kind {
        group: "",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status: false,
        scale: false,
    },
    Kind {
        group: "",
        version: "v1",
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
        status: true,
        scale: false,
    },
    Kind {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status: false,
        scale: false,
    },
    Kind {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        kind: "Lease",
        namespaced: true,
        status: false,
        scale: false,
    },
    Kind {
        group: "crawl.example.com",
        version: "v1alpha1",
        plural: "proxies",
        kind: "Proxy",
        namespaced: true,
        status: true,
        scale: false,
    },
    Kind {
        group: "crawl.example.com",
        version: "v1alpha1",
        plural: "proxypools",
        kind: "ProxyPool",
        namespaced: true,
        status: true,
        scale: true,
    },
    Kind {
        group: "apiextensions.k8s.io",
        version: "v1",
        plural: "customresourcedefinitions",
        kind: "CustomResourceDefinition",
        namespaced: false,
        status: true,
        scale: false,
    },
];

/// The kind served at `group/version/plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<usize> {
    KINDS
        .iter()
        .position(|k| k.group == group && k.version == version && k.plural == plural)
}
