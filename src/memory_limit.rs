//! The process's memory limit: the smallest `memory.max` (cgroup v2) or
//! `memory.limit_in_bytes` (cgroup v1) on the path from the process's
//! cgroup up to the root, as a container runtime sets it from a pod's
//! `resources.limits.memory`. A listener sizes its connection cap from it
//! as well as from the file limit ([`crate::listener_limits`]), so a flood
//! of connections is held at the cap instead of getting the process
//! killed for memory.

use std::path::{Path, PathBuf};

/// Where cgroup file systems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// At or above this a cgroup v1 limit means none (the kernel's "unlimited"
/// is `PAGE_COUNTER_MAX` pages, about 2^63 bytes).
const UNLIMITED_V1: u64 = 1 << 62;

/// The process's memory limit in bytes, `None` when there is none or it
/// cannot be read.
pub fn current() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_under(&cgroups, Path::new(CGROUP_ROOT))
}

/// The memory limit for a process whose `/proc/self/cgroup` reads
/// `cgroups`, with cgroup file systems mounted under `root`.
pub fn limit_under(cgroups: &str, root: &Path) -> Option<u64> {
    let mut unified = None;
    let mut v1 = None;
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if controllers.is_empty() {
            unified = Some(path);
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        }
    }
    // A cgroup v1 memory controller takes precedence: on a hybrid host
    // the unified hierarchy has no memory controller.
    if let Some(path) = v1 {
        return smallest_on_path(&root.join("memory"), path, "memory.limit_in_bytes");
    }
    smallest_on_path(root, unified?, "memory.max")
}

/// The smallest limit in `file` of the cgroup at `path` (under `mount`) and
/// of its ancestors. Inside a container the cgroup namespace may show the
/// host's path while the container's own cgroup is mounted at the root: a
/// directory that does not exist is skipped.
fn smallest_on_path(mount: &Path, path: &str, file: &str) -> Option<u64> {
    let mut dir: PathBuf = mount.to_path_buf();
    let mut limits: Vec<Option<u64>> = vec![read_limit(&dir.join(file))];
    for part in path.split('/').filter(|p| !p.is_empty()) {
        dir.push(part);
        limits.push(read_limit(&dir.join(file)));
    }
    limits.into_iter().flatten().min()
}

/// One limit file: bytes, or `None` for `max`, an absent or unreadable file
/// or cgroup v1's "unlimited".
fn read_limit(file: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let bytes: u64 = text.trim().parse().ok()?;
    (bytes < UNLIMITED_V1).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, relative: &str, text: &str) {
        let file = root.join(relative);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, text).unwrap();
    }

    #[test]
    fn cgroup_v2_the_smallest_limit_up_to_the_root_counts() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let cgroups = "0::/kubepods/pod1/ctr\n";
        assert_eq!(limit_under(cgroups, root), None, "no files: no limit");
        write(root, "kubepods/pod1/ctr/memory.max", "max\n");
        assert_eq!(limit_under(cgroups, root), None, "max: no limit");
        write(root, "kubepods/pod1/memory.max", "536870912\n");
        assert_eq!(limit_under(cgroups, root), Some(512 << 20), "the pod's limit");
        write(root, "kubepods/pod1/ctr/memory.max", "268435456\n");
        assert_eq!(
            limit_under(cgroups, root),
            Some(256 << 20),
            "the container's, smaller"
        );
        write(root, "kubepods/memory.max", "134217728\n");
        assert_eq!(
            limit_under(cgroups, root),
            Some(128 << 20),
            "an ancestor's, smaller still"
        );
    }

    #[test]
    fn inside_a_cgroup_namespace_the_root_is_the_container_s_own() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "memory.max", "268435456\n");
        assert_eq!(limit_under("0::/\n", root.path()), Some(256 << 20));
        // A host path the namespace shows but the mount does not have.
        assert_eq!(
            limit_under("0::/kubepods/pod1/ctr\n", root.path()),
            Some(256 << 20)
        );
    }

    #[test]
    fn cgroup_v1_memory_controller_and_its_unlimited() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let cgroups = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        write(root, "memory/memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(limit_under(cgroups, root), None, "unlimited");
        write(root, "memory/docker/abc/memory.limit_in_bytes", "1073741824\n");
        assert_eq!(limit_under(cgroups, root), Some(1 << 30));
        assert_eq!(limit_under("garbage\n\n", root), None);
    }
}
