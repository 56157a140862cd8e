//! The workspace's binaries the end-to-end tests run as an operator would: `limiter`,
//! `limiter-allocator`, `limiter-lab`, `limiter-fleet-lab`, `limiter-soak`, found in the target directory the running test
//! executable was built into (target/<profile>/, beside its deps/).
//!
//! Why not `env!("CARGO_BIN_EXE_…")`: cargo sets it only for a binary of the test's own
//! package, and these tests live in limiter-tests, not in the binaries' packages. So cargo
//! does not build the binaries for `cargo test -p limiter-tests`: `cargo xtask test` builds
//! them first; by hand, `cargo build --release` does. A missing one fails the test with a
//! message that says so, never a skip.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    sync::OnceLock,
};

/// One binary of the workspace, located on first use (a panic naming it and how to build
/// it when it is missing). Derefs to its path: `Command::new(LIMITER)`, `Path::new(LIMITER)`.
pub struct Binary {
    name: &'static str,
    path: OnceLock<PathBuf>,
}

impl Binary {
    const fn new(name: &'static str) -> Binary {
        Binary {
            name,
            path: OnceLock::new(),
        }
    }

    /// Its path, target/<profile>/<name>.
    ///
    /// # Panics
    /// When the binary is missing (not built) or the test executable cannot be located.
    pub fn path(&self) -> &Path {
        self.path.get_or_init(|| {
            let dir = target_profile_dir();
            let path = dir.join(self.name);
            assert!(
                path.is_file(),
                "{} is missing: the end-to-end tests run the built binary; build it with \
                 `cargo build --release` (`cargo xtask test` does)",
                path.display()
            );
            path
        })
    }
}

impl AsRef<Path> for Binary {
    fn as_ref(&self) -> &Path {
        self.path()
    }
}

impl AsRef<OsStr> for Binary {
    fn as_ref(&self) -> &OsStr {
        self.path().as_os_str()
    }
}

/// target/<profile>/ of the running executable: a test executable lives in its deps/, a
/// binary (the bench, the lab) in it directly.
fn target_profile_dir() -> PathBuf {
    let exe =
        std::env::current_exe().unwrap_or_else(|e| panic!("locating the running executable: {e}"));
    let dir = exe
        .parent()
        .unwrap_or_else(|| panic!("{} has no parent directory", exe.display()));
    match dir.file_name().and_then(OsStr::to_str) {
        Some("deps") => dir.parent().unwrap_or(dir).to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

static LIMITER_BINARY: Binary = Binary::new("limiter");
static LIMITER_ALLOCATOR_BINARY: Binary = Binary::new("limiter-allocator");
static LIMITER_LAB_BINARY: Binary = Binary::new("limiter-lab");
static LIMITER_FLEET_LAB_BINARY: Binary = Binary::new("limiter-fleet-lab");
static LIMITER_SOAK_BINARY: Binary = Binary::new("limiter-soak");

/// The daemon and CLI (package limiter-user).
pub static LIMITER: &Binary = &LIMITER_BINARY;
/// The fleet's allocator (package limiter-allocator).
pub static LIMITER_ALLOCATOR: &Binary = &LIMITER_ALLOCATOR_BINARY;
/// The self-contained lab (package limiter-bench).
pub static LIMITER_LAB: &Binary = &LIMITER_LAB_BINARY;
/// The fleet lab (package limiter-bench).
pub static LIMITER_FLEET_LAB: &Binary = &LIMITER_FLEET_LAB_BINARY;
/// The soak, the dress rehearsal (package limiter-bench).
pub static LIMITER_SOAK: &Binary = &LIMITER_SOAK_BINARY;
