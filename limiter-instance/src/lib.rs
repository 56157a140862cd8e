//! One instance per control socket, for the daemon (`limiter run`) and the allocator
//! (`limiter-allocator run`) alike. Claiming the configured socket path touches only what
//! the claimant makes itself:
//!
//! - The socket's directory is created (mode 0700) only when it is missing; an existing
//!   directory (`/run`, say) keeps its mode and owner. The socket itself is mode 0600 and
//!   both servers check their peer's credentials, so an existing directory's mode is not
//!   what keeps others out.
//! - A lock file beside the socket (`<path without extension>.lock`, `flock`) makes the
//!   instance single: a second one is refused, naming the pid that holds the lock.
//! - Whatever sits at the socket path is replaced only if it is a socket nobody answers
//!   on (left by a crash). A live socket (another program, or an older build that took no
//!   lock) and anything that is not a socket are refused, naming what is in the way.
//! - When the [`Instance`] is dropped, the socket goes only if it is still the one this
//!   instance bound. The lock file stays: removing it would let a third instance lock a
//!   new file while a second still holds the old one.

use std::{
    fs::{self, File, FileType},
    io::{self, Read as _, Write as _},
    os::unix::{
        fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _},
        net::{UnixListener, UnixStream},
    },
    path::{Path, PathBuf},
};

/// Why a control socket could not be claimed. Each says what is in the way.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error(
        "another {owner} is running ({holder} holds the lock {}); stop it first",
        lock.display()
    )]
    AlreadyRunning {
        owner: &'static str,
        lock: PathBuf,
        holder: String,
    },
    #[error(
        "{} is live: something answers on it, though no other {owner} holds {}. The {owner} \
         does not take over a socket in use: stop what serves there (an older {owner}?) or \
         choose another control_socket",
        path.display(),
        lock.display()
    )]
    LiveSocket {
        owner: &'static str,
        path: PathBuf,
        lock: PathBuf,
    },
    #[error(
        "{} is in the way: it is {kind}, not {wanted}. The {owner} replaces nothing it did not \
         create: move it away or choose another control_socket",
        path.display()
    )]
    InTheWay {
        owner: &'static str,
        path: PathBuf,
        kind: &'static str,
        wanted: &'static str,
    },
    #[error("{} is not a socket path (it names no file)", .0.display())]
    NotAFilePath(PathBuf),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: String) -> impl FnOnce(io::Error) -> ClaimError {
    move |source| ClaimError::Io { what, source }
}

/// A claimed control socket. Keep it for the life of the process: dropping it removes
/// the socket (if still this instance's) and releases the lock.
#[derive(Debug)]
pub struct Instance {
    socket: PathBuf,
    lock_path: PathBuf,
    /// (device, inode) of the socket this instance bound.
    bound: (u64, u64),
    // Dropped after `Drop::drop` has removed the socket: the lock is released last.
    _lock: File,
}

/// What claiming did, for the caller's log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ClaimReport {
    /// Directories created for the socket (outermost first), each mode 0700.
    pub created_dirs: Vec<PathBuf>,
    /// A dead socket left at the path (by a crash) was replaced.
    pub replaced_stale: bool,
}

/// A claimed socket and its listener.
#[derive(Debug)]
pub struct Claimed {
    pub instance: Instance,
    pub listener: UnixListener,
    pub report: ClaimReport,
}

impl Instance {
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn lock_path(&self) -> &Path {
        &self.lock_path
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let ours = fs::symlink_metadata(&self.socket)
            .is_ok_and(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == self.bound);
        if ours {
            let _ = fs::remove_file(&self.socket);
        }
    }
}

/// The lock file of `socket`: beside it, `limiter.sock` → `limiter.lock` (the name the
/// daemon has always used, so an older daemon's lock still counts).
pub fn lock_path(socket: &Path) -> PathBuf {
    let lock = socket.with_extension("lock");
    if lock == socket {
        let mut name = socket.as_os_str().to_owned();
        name.push(".lock");
        PathBuf::from(name)
    } else {
        lock
    }
}

/// What a file type is, in an error message.
pub fn kind_of(t: FileType) -> &'static str {
    if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_block_device() || t.is_char_device() {
        "a device node"
    } else {
        "a file of another kind"
    }
}

/// Claims `socket` for one `owner` ("limiter daemon", "limiter-allocator"): creates its
/// directory if missing, takes the lock beside it, replaces a dead socket, refuses
/// anything else at the path, and binds (mode 0600).
pub fn claim(socket: &Path, owner: &'static str) -> Result<Claimed, ClaimError> {
    if socket.file_name().is_none() {
        return Err(ClaimError::NotAFilePath(socket.to_path_buf()));
    }
    let dir = match socket.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut report = ClaimReport {
        created_dirs: ensure_dir(dir, owner)?,
        replaced_stale: false,
    };
    let lock_path = lock_path(socket);
    let lock = take_lock(&lock_path, owner)?;

    match fs::symlink_metadata(socket) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(format!("inspecting {}", socket.display()))(e)),
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(socket) {
            Ok(_) => {
                return Err(ClaimError::LiveSocket {
                    owner,
                    path: socket.to_path_buf(),
                    lock: lock_path,
                })
            }
            // Nobody listens: a socket left by a crash. We hold the lock, so no instance
            // of ours can be binding it right now.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                fs::remove_file(socket).map_err(io_err(format!(
                    "removing the stale socket {}",
                    socket.display()
                )))?;
                report.replaced_stale = true;
            }
            Err(e) => return Err(io_err(format!("probing {}", socket.display()))(e)),
        },
        Ok(m) => {
            return Err(ClaimError::InTheWay {
                owner,
                path: socket.to_path_buf(),
                kind: kind_of(m.file_type()),
                wanted: "a socket",
            })
        }
    }

    let listener =
        UnixListener::bind(socket).map_err(io_err(format!("binding {}", socket.display())))?;
    set_mode(socket, 0o600)?;
    let m =
        fs::symlink_metadata(socket).map_err(io_err(format!("inspecting {}", socket.display())))?;
    Ok(Claimed {
        instance: Instance {
            socket: socket.to_path_buf(),
            lock_path,
            bound: (m.dev(), m.ino()),
            _lock: lock,
        },
        listener,
        report,
    })
}

fn set_mode(path: &Path, mode: u32) -> Result<(), ClaimError> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err(format!(
        "setting mode {mode:o} on {}",
        path.display()
    )))
}

/// Creates the missing directories up to `dir`, each mode 0700; returns them. Existing
/// ones are left exactly as they are.
fn ensure_dir(dir: &Path, owner: &'static str) -> Result<Vec<PathBuf>, ClaimError> {
    let not_a_dir = |path: &Path, t: FileType| ClaimError::InTheWay {
        owner,
        path: path.to_path_buf(),
        kind: kind_of(t),
        wanted: "a directory (the control socket's)",
    };
    let mut missing = Vec::new();
    let mut at = dir;
    loop {
        match fs::metadata(at) {
            Ok(m) if m.is_dir() => break,
            Ok(m) => return Err(not_a_dir(at, m.file_type())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(at.to_path_buf());
                match at.parent() {
                    Some(p) if !p.as_os_str().is_empty() => at = p,
                    _ => break,
                }
            }
            Err(e) => return Err(io_err(format!("inspecting {}", at.display()))(e)),
        }
    }
    let mut created = Vec::new();
    for d in missing.into_iter().rev() {
        match fs::DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => {
                // The umask may have narrowed the mode; it is ours, so make it exact.
                set_mode(&d, 0o700)?;
                created.push(d);
            }
            // Made by someone else meanwhile (or a dangling symlink): not ours to chmod.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let m = fs::metadata(&d).map_err(io_err(format!("inspecting {}", d.display())))?;
                if !m.is_dir() {
                    return Err(not_a_dir(&d, m.file_type()));
                }
            }
            Err(e) => return Err(io_err(format!("creating {}", d.display()))(e)),
        }
    }
    Ok(created)
}

/// Opens (never through a symlink) and locks the lock file, then writes this pid in it.
fn take_lock(path: &Path, owner: &'static str) -> Result<File, ClaimError> {
    let mut file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                ClaimError::InTheWay {
                    owner,
                    path: path.to_path_buf(),
                    kind: "a symbolic link",
                    wanted: "a lock file",
                }
            } else {
                io_err(format!("opening the lock file {}", path.display()))(e)
            }
        })?;
    let m = file
        .metadata()
        .map_err(io_err(format!("inspecting {}", path.display())))?;
    if !m.is_file() {
        return Err(ClaimError::InTheWay {
            owner,
            path: path.to_path_buf(),
            kind: kind_of(m.file_type()),
            wanted: "a lock file",
        });
    }
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let holder = match text.trim().parse::<u32>() {
                Ok(pid) => format!("pid {pid}"),
                Err(_) => "a process".to_string(),
            };
            return Err(ClaimError::AlreadyRunning {
                owner,
                lock: path.to_path_buf(),
                holder,
            });
        }
        Err(fs::TryLockError::Error(e)) => {
            return Err(io_err(format!("locking {}", path.display()))(e))
        }
    }
    file.set_len(0)
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .map_err(io_err(format!("writing the pid into {}", path.display())))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    const OWNER: &str = "test daemon";

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn creates_a_missing_directory_0700_and_the_socket_0600() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("a/b/ctl.sock");
        let claimed = claim(&socket, OWNER).unwrap();
        assert_eq!(
            claimed.report.created_dirs,
            [tmp.path().join("a"), tmp.path().join("a/b")]
        );
        assert_eq!(mode(&tmp.path().join("a")), 0o700);
        assert_eq!(mode(&tmp.path().join("a/b")), 0o700);
        assert_eq!(mode(&socket), 0o600);
        let pid = fs::read_to_string(tmp.path().join("a/b/ctl.lock")).unwrap();
        assert_eq!(pid.trim(), std::process::id().to_string());
        assert!(UnixStream::connect(&socket).is_ok());
    }

    #[test]
    fn an_existing_directory_keeps_its_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).unwrap();
        let claimed = claim(&dir.join("x.sock"), OWNER).unwrap();
        assert!(claimed.report.created_dirs.is_empty());
        assert_eq!(mode(&dir), 0o1777);
    }

    #[test]
    fn a_second_instance_is_refused_naming_the_pid() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("ctl.sock");
        let first = claim(&socket, OWNER).unwrap();
        let err = claim(&socket, OWNER).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, ClaimError::AlreadyRunning { .. })
                && text.contains(&format!("pid {}", std::process::id()))
                && text.contains("another test daemon is running"),
            "{text}"
        );
        // The first one's socket is untouched and still answers.
        assert!(UnixStream::connect(&socket).is_ok());
        drop(first);
        assert!(!socket.exists(), "the socket outlived its instance");
        claim(&socket, OWNER).unwrap();
    }

    #[test]
    fn a_dead_socket_is_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("ctl.sock");
        drop(UnixListener::bind(&socket).unwrap());
        assert!(socket.exists());
        let claimed = claim(&socket, OWNER).unwrap();
        assert!(claimed.report.replaced_stale);
        assert!(UnixStream::connect(&socket).is_ok());
    }

    #[test]
    fn a_live_socket_is_refused_and_left_serving() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("ctl.sock");
        let foreign = UnixListener::bind(&socket).unwrap();
        let err = claim(&socket, OWNER).unwrap_err();
        assert!(matches!(err, ClaimError::LiveSocket { .. }), "{err}");
        assert!(err.to_string().contains(&socket.display().to_string()));
        assert!(
            UnixStream::connect(&socket).is_ok(),
            "the live socket was taken"
        );
        drop(foreign);
        // The refusal released the lock: with the socket dead, a claim succeeds.
        claim(&socket, OWNER).unwrap();
    }

    #[test]
    fn anything_but_a_socket_is_in_the_way() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file.sock");
        fs::write(&file, "operator's notes").unwrap();
        let err = claim(&file, OWNER).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&file.display().to_string()) && text.contains("a regular file"),
            "{text}"
        );
        assert_eq!(fs::read_to_string(&file).unwrap(), "operator's notes");

        let dir = tmp.path().join("dir.sock");
        fs::create_dir(&dir).unwrap();
        let text = claim(&dir, OWNER).unwrap_err().to_string();
        assert!(text.contains("a directory, not a socket"), "{text}");
        assert!(dir.is_dir());

        let link = tmp.path().join("link.sock");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let text = claim(&link, OWNER).unwrap_err().to_string();
        assert!(text.contains("a symbolic link"), "{text}");
        assert_eq!(fs::read_to_string(&file).unwrap(), "operator's notes");
    }

    #[test]
    fn a_lock_file_that_is_a_symlink_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("precious");
        fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, tmp.path().join("ctl.lock")).unwrap();
        let text = claim(&tmp.path().join("ctl.sock"), OWNER)
            .unwrap_err()
            .to_string();
        assert!(text.contains("ctl.lock is in the way"), "{text}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
    }

    #[test]
    fn a_file_where_the_directory_should_be_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("run"), "").unwrap();
        let text = claim(&tmp.path().join("run/x.sock"), OWNER)
            .unwrap_err()
            .to_string();
        assert!(text.contains("a regular file, not a directory"), "{text}");
    }

    #[test]
    fn drop_leaves_a_socket_that_is_no_longer_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("ctl.sock");
        let claimed = claim(&socket, OWNER).unwrap();
        fs::remove_file(&socket).unwrap();
        let other = UnixListener::bind(&socket).unwrap();
        drop(claimed);
        assert!(socket.exists(), "dropping removed another's socket");
        drop(other);
    }

    #[test]
    fn lock_paths() {
        assert_eq!(
            lock_path(Path::new("/run/limiter/limiter.sock")),
            Path::new("/run/limiter/limiter.lock")
        );
        assert_eq!(lock_path(Path::new("/run/ctl")), Path::new("/run/ctl.lock"));
        assert_eq!(
            lock_path(Path::new("/run/odd.lock")),
            Path::new("/run/odd.lock.lock")
        );
    }
}
