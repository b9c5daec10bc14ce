//! The Pod Security Standards' `restricted` profile (the Baseline controls
//! included), checked offline on a Pod as the admission controller checks
//! it: each control of the published standard, by field. Returns what
//! violates it, in the standard's words.

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SecurityContext};

/// Volume types the restricted profile allows.
const ALLOWED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Every violation of the restricted profile.
pub fn restricted_violations(pod: &Pod) -> Vec<String> {
    let mut out = Vec::new();
    let Some(spec) = &pod.spec else {
        return vec!["no spec".into()];
    };
    let pod_ctx = spec.security_context.clone().unwrap_or_default();
    // Baseline: host namespaces.
    for (set, what) in [
        (spec.host_network, "hostNetwork"),
        (spec.host_pid, "hostPID"),
        (spec.host_ipc, "hostIPC"),
    ] {
        if set == Some(true) {
            out.push(format!("{what} must not be set"));
        }
    }
    // Restricted: volume types (this also rules out hostPath).
    for volume in spec.volumes.iter().flatten() {
        let json = serde_json::to_value(volume).unwrap_or_default();
        let kinds: Vec<String> = json
            .as_object()
            .into_iter()
            .flat_map(|o| o.keys().cloned())
            .filter(|k| k != "name")
            .collect();
        for kind in kinds {
            if !ALLOWED_VOLUMES.contains(&kind.as_str()) {
                out.push(format!("volume {} uses the restricted type {kind}", volume.name));
            }
        }
    }
    // Restricted: seccomp on the pod or every container; never Unconfined.
    let pod_seccomp = seccomp_type(&pod_ctx);
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        let ctx = c.security_context.clone().unwrap_or_default();
        out.extend(container_violations(c, &ctx, &pod_ctx, pod_seccomp.as_deref()));
    }
    out
}

fn seccomp_type(ctx: &PodSecurityContext) -> Option<String> {
    ctx.seccomp_profile.as_ref().map(|p| p.type_.clone())
}

fn container_violations(
    c: &Container,
    ctx: &SecurityContext,
    pod: &PodSecurityContext,
    pod_seccomp: Option<&str>,
) -> Vec<String> {
    let mut out = Vec::new();
    let name = &c.name;
    if ctx.privileged == Some(true) {
        out.push(format!("{name}: privileged"));
    }
    if c.ports
        .iter()
        .flatten()
        .any(|p| p.host_port.is_some_and(|h| h != 0))
    {
        out.push(format!("{name}: hostPort"));
    }
    if ctx.allow_privilege_escalation != Some(false) {
        out.push(format!("{name}: allowPrivilegeEscalation must be false"));
    }
    if ctx.run_as_non_root.or(pod.run_as_non_root) != Some(true) {
        out.push(format!("{name}: runAsNonRoot must be true"));
    }
    if ctx.run_as_user.or(pod.run_as_user) == Some(0) {
        out.push(format!("{name}: runAsUser must not be 0"));
    }
    let seccomp = ctx
        .seccomp_profile
        .as_ref()
        .map(|p| p.type_.as_str())
        .or(pod_seccomp);
    if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
        out.push(format!(
            "{name}: seccompProfile.type must be RuntimeDefault or Localhost"
        ));
    }
    let caps = ctx.capabilities.clone().unwrap_or_default();
    if !caps.drop.iter().flatten().any(|d| d == "ALL") {
        out.push(format!("{name}: capabilities must drop ALL"));
    }
    for added in caps.add.iter().flatten() {
        if added != "NET_BIND_SERVICE" {
            out.push(format!("{name}: capability {added} may not be added"));
        }
    }
    if ctx.proc_mount.as_deref().is_some_and(|m| m != "Default") {
        out.push(format!("{name}: procMount must be Default"));
    }
    out
}
