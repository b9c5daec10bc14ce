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
    /// Short names discovery announces (`kubectl get deploy`).
    pub short_names: &'static [&'static str],
    /// Defined by a CustomResourceDefinition: in a cluster
    /// ([`crate::FakeApiServer::start_cluster`]) served only while the CRD
    /// `<plural>.<group>` exists, with the short names the CRD declares.
    pub custom: bool,
}

impl Kind {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The name of the CRD that defines a custom kind.
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// Where its objects live: `/api/v1` or `/apis/<group>/<version>`.
    pub fn root(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
}

const fn kind(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
) -> Kind {
    Kind {
        group,
        version,
        plural,
        kind,
        namespaced,
        status: false,
        scale: false,
        short_names,
        custom: false,
    }
}

const fn with_status(k: Kind) -> Kind {
    Kind { status: true, ..k }
}

const fn with_scale(k: Kind) -> Kind {
    Kind {
        status: true,
        scale: true,
        ..k
    }
}

const fn custom(k: Kind) -> Kind {
    Kind { custom: true, ..k }
}

const RBAC: &str = "rbac.authorization.k8s.io";

pub const KINDS: &[Kind] = &[
    kind("", "v1", "secrets", "Secret", true, &[]),
    kind("", "v1", "configmaps", "ConfigMap", true, &["cm"]),
    with_status(kind("", "v1", "pods", "Pod", true, &["po"])),
    kind("", "v1", "events", "Event", true, &["ev"]),
    with_status(kind("", "v1", "namespaces", "Namespace", false, &["ns"])),
    with_status(kind("", "v1", "services", "Service", true, &["svc"])),
    kind("", "v1", "serviceaccounts", "ServiceAccount", true, &["sa"]),
    kind("events.k8s.io", "v1", "events", "Event", true, &["ev"]),
    kind("coordination.k8s.io", "v1", "leases", "Lease", true, &[]),
    with_scale(kind("apps", "v1", "deployments", "Deployment", true, &["deploy"])),
    kind(RBAC, "v1", "roles", "Role", true, &[]),
    kind(RBAC, "v1", "rolebindings", "RoleBinding", true, &[]),
    kind(RBAC, "v1", "clusterroles", "ClusterRole", false, &[]),
    kind(
        RBAC,
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        &[],
    ),
    kind(
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "NetworkPolicy",
        true,
        &["netpol"],
    ),
    custom(with_status(kind(
        "crawl.example.com",
        "v1alpha1",
        "proxies",
        "Proxy",
        true,
        &[],
    ))),
    custom(with_scale(kind(
        "crawl.example.com",
        "v1alpha1",
        "proxypools",
        "ProxyPool",
        true,
        &[],
    ))),
    with_status(kind(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
    )),
];

/// The kind served at `group/version/plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<usize> {
    KINDS
        .iter()
        .position(|k| k.group == group && k.version == version && k.plural == plural)
}
