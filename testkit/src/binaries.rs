//! Where the workspace's binaries and its shipped model package are.

use std::path::{Path, PathBuf};

/// The workspace's root directory (this crate's parent).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ has a parent")
        .to_path_buf()
}

/// The default model package that ships with the repo: the one place the tests name it.
pub fn shipped_package() -> PathBuf {
    workspace_root().join("models/en-es-rel-ldpe")
}

/// A binary of this workspace, built in the same profile as the running test: cargo puts a
/// test executable in `target/PROFILE/deps/` and the workspace's binaries in
/// `target/PROFILE/`.
///
/// # Panics
///
/// When the binary is not built: `cargo test` builds only the binaries of the package under
/// test, so the others need a `cargo build --workspace --bins` first.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the running executable's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test executable lives in target/PROFILE/deps/");
    let path = profile_dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        path.display()
    );
    path
}

/// The release build of a workspace binary as the benchmarks name it, `target/release/NAME`:
/// relative, because they are run from the workspace root and print the path in their
/// reports.
pub fn release_binary(name: &str) -> PathBuf {
    Path::new("target/release").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_package_is_in_the_workspace() {
        assert!(shipped_package().join("manifest.json").is_file());
    }

    #[test]
    fn release_binaries_are_named_from_the_workspace_root() {
        assert_eq!(
            release_binary("nmt-server"),
            Path::new("target/release/nmt-server")
        );
    }
}
