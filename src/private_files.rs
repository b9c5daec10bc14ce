//! The operator's state is its own: directories it creates are `0700` and
//! files `0600`, whatever the umask. State holds lease ids, installation
//! ids, proxy records and (with credentials) secrets; nobody else on the
//! machine needs to read them.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Creates `dir` (and missing parents) and makes it `0700`, also when it
/// existed with wider permissions.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// Options that create a file `0600`.
pub fn private_options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(0o600);
    options
}

/// Creates (or truncates) `path` as a `0600` file.
pub fn create_private(path: &Path) -> io::Result<File> {
    private_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
}

/// Makes an existing file `0600` (one another library created).
pub fn make_private(path: &Path) -> io::Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn directories_and_files_are_private_whatever_existed() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&dir.join("a/b")).unwrap();
        private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("a/b")), 0o700);
        let file = dir.join("f");
        create_private(&file).unwrap();
        assert_eq!(mode(&file), 0o600);
        let other = dir.join("g");
        fs::write(&other, "x").unwrap();
        make_private(&other).unwrap();
        assert_eq!(mode(&other), 0o600);
    }
}
