//! What lives under `pin_dir`, and which of it is the limiter's.
//!
//! The limiter pins its maps under the names of `limiter_common::abi::map_name`, one
//! bpf_link per interface as `link_<iface>`, the programs it runs as `prog_<id>`, and the
//! program it took a hook from as `taken_<iface>` (`xdp_share_fallback`). Anything else
//! in the directory (another tool's pins, a subdirectory), and anything under one of
//! those names that is not what the limiter would have put there (a map of another name,
//! a link running another program), is someone else's: cleanup ([`crate::attach::teardown`])
//! leaves it and says so, and nothing replaces it.
//!
//! Why the programs are pinned: a restarted daemon must recognise its own attachment (a
//! link's program, a tc filter's) before it replaces it, and the kernel opens a program by
//! its id only for CAP_SYS_ADMIN, which the daemon's unit does not grant. A program id
//! found among the `prog_<id>` pins is the limiter's without asking the kernel by id.

use std::{
    ffi::CString,
    fs,
    os::fd::{FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use aya::{maps::MapInfo, programs::links::PinnedLink};
use limiter_common::abi::{map_name, PROGRAM_NAME, PROGRAM_NAME_LINEAR, PROGRAM_NAME_TC};

use crate::{error::Error, host::loaded::program_info};

/// Where the link of `iface` is pinned.
pub fn link_pin_path(pin_dir: &Path, iface: &str) -> PathBuf {
    pin_dir.join(format!("{LINK_PIN_PREFIX}{iface}"))
}

/// Pinned links are named `link_<interface>` under pin_dir.
pub const LINK_PIN_PREFIX: &str = "link_";

/// The program the limiter took the hook of `<iface>` from is pinned as
/// `taken_<iface>` under pin_dir.
pub const TAKEN_PIN_PREFIX: &str = "taken_";

/// Where the program taken from the hook of `iface` is pinned.
pub fn taken_pin_path(pin_dir: &Path, iface: &str) -> PathBuf {
    pin_dir.join(format!("{TAKEN_PIN_PREFIX}{iface}"))
}

/// The programs a daemon runs are pinned as `prog_<id>` under pin_dir.
pub const PROGRAM_PIN_PREFIX: &str = "prog_";

/// Where the program with kernel id `id` is pinned.
pub fn program_pin_path(pin_dir: &Path, id: u32) -> PathBuf {
    pin_dir.join(format!("{PROGRAM_PIN_PREFIX}{id}"))
}

/// A name the limiter pins under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinName<'a> {
    /// One of the program's maps.
    Map(&'static str),
    /// The link running the program on this interface.
    Link(&'a str),
    /// The program the limiter took this interface's hook from
    /// (`xdp_share_fallback = "tail-call"`), which it tail-calls.
    Taken(&'a str),
    /// One of the limiter's programs, by its kernel id: what its links and filters run.
    Program(u32),
}

/// Whether `name` is one the limiter pins under (pure: by name only).
pub fn parse_name(name: &str) -> Option<PinName<'_>> {
    if let Some(map) = map_name::ALL.iter().find(|m| **m == name) {
        return Some(PinName::Map(map));
    }
    // Interface names are 1..15 bytes without '/' (IFNAMSIZ).
    let iface = |prefix: &str| {
        name.strip_prefix(prefix)
            .filter(|iface: &&str| !iface.is_empty() && iface.len() < 16)
    };
    if let Some(i) = iface(LINK_PIN_PREFIX) {
        return Some(PinName::Link(i));
    }
    if let Some(digits) = name.strip_prefix(PROGRAM_PIN_PREFIX) {
        // Only the canonical spelling (no sign, no leading zero) is the limiter's.
        return digits
            .parse::<u32>()
            .ok()
            .filter(|id| *id != 0 && id.to_string() == digits)
            .map(PinName::Program);
    }
    iface(TAKEN_PIN_PREFIX).map(PinName::Taken)
}

/// The kind of BPF object pinned somewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Object {
    Map,
    Program,
    Link,
    /// What the kernel's file says it is.
    Other(String),
}

/// Opens the pinned object at `path` (BPF_OBJ_GET) and tells its kind from the file the
/// kernel hands back (`anon_inode:bpf-map`, `bpf-prog`, `bpf-link`; older kernels `bpf_link`).
pub(crate) fn object_kind(path: &Path) -> std::io::Result<Object> {
    #[repr(C)]
    #[derive(Default)]
    struct ObjGetAttr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
        path_fd: i32,
        // Explicit, so that it is zero: the kernel refuses nonzero bytes past the fields.
        _pad: u32,
    }
    const BPF_OBJ_GET: libc::c_long = 7;
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut attr = ObjGetAttr {
        pathname: c.as_ptr() as u64,
        ..ObjGetAttr::default()
    };
    // SAFETY: attr is a valid BPF_OBJ_GET attribute pointing at a NUL-terminated path.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET,
            &mut attr as *mut ObjGetAttr,
            std::mem::size_of::<ObjGetAttr>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    use std::os::fd::AsRawFd as _;
    let target = fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let target = target.to_string_lossy();
    Ok(if target.contains("bpf-map") {
        Object::Map
    } else if target.contains("bpf-prog") {
        Object::Program
    } else if target.contains("bpf_link") || target.contains("bpf-link") {
        Object::Link
    } else {
        Object::Other(target.into_owned())
    })
}

/// The names of the limiter's programs (the kernel keeps 15 bytes of a name).
pub fn is_limiter_program(name: &str) -> bool {
    [PROGRAM_NAME, PROGRAM_NAME_LINEAR, PROGRAM_NAME_TC]
        .iter()
        .any(|p| p.get(..15).unwrap_or(p) == name)
}

/// `Ok` if the object pinned at `path` under `name` is what the limiter pins there;
/// otherwise what it is instead.
pub fn check_ours(path: &Path, name: PinName<'_>) -> Result<(), String> {
    let meta = fs::symlink_metadata(path).map_err(|e| format!("unreadable: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "{}, not a pinned BPF object",
            limiter_instance::kind_of(meta.file_type())
        ));
    }
    let kind = object_kind(path).map_err(|e| format!("not a pinned BPF object ({e})"))?;
    match (name, kind) {
        (PinName::Map(expected), Object::Map) => {
            let info = MapInfo::from_pin(path).map_err(|e| format!("unreadable map: {e}"))?;
            match info.name_as_str() {
                Some(found) if found == expected => Ok(()),
                found => Err(format!(
                    "a map named {:?}, not the limiter's {expected}",
                    found.unwrap_or("?")
                )),
            }
        }
        (PinName::Link(_), Object::Link) => {
            let link = PinnedLink::from_pin(path).map_err(|e| format!("unreadable link: {e}"))?;
            let fd_link: aya::programs::links::FdLink = link.into();
            let prog_id = fd_link
                .info()
                .map_err(|e| format!("unreadable link: {e}"))?
                .program_id();
            // A program the limiter pinned, recognised without opening it by id.
            if path
                .parent()
                .is_some_and(|dir| pinned_program_ids(dir).contains(&prog_id))
            {
                return Ok(());
            }
            let name = program_info(prog_id).and_then(|p| p.name_as_str().map(str::to_string));
            match name {
                Some(n) if is_limiter_program(&n) => Ok(()),
                Some(n) => Err(format!("a link running program {n:?}, not the limiter")),
                None if !may_open_programs_by_id() => Err(format!(
                    "a link running program id {prog_id}, which is none of the limiter's \
                     pinned programs ({PROGRAM_PIN_PREFIX}<id>), and which only \
                     CAP_SYS_ADMIN may look up by its id (a link pinned by a limiter \
                     older than its program pins: start once as root to adopt it)"
                )),
                None => Err(format!(
                    "a link running program id {prog_id}, not the limiter"
                )),
            }
        }
        (PinName::Program(id), Object::Program) => {
            let info = aya::programs::ProgramInfo::from_pin(path)
                .map_err(|e| format!("unreadable program: {e}"))?;
            let name = info.name_as_str().unwrap_or("?");
            if info.id() != id {
                Err(format!(
                    "program {} ({name:?}) pinned under id {id}",
                    info.id()
                ))
            } else if !is_limiter_program(name) {
                Err(format!("a program named {name:?}, not the limiter's"))
            } else {
                Ok(())
            }
        }
        // Someone else's program, pinned by the limiter: any program is what it pins.
        (PinName::Taken(_), Object::Program) => Ok(()),
        (_, kind) => Err(format!(
            "a pinned {}, not the limiter's {}",
            match kind {
                Object::Map => "map".to_string(),
                Object::Program => "program".to_string(),
                Object::Link => "link".to_string(),
                Object::Other(what) => format!("object ({what})"),
            },
            match name {
                PinName::Map(_) => "map",
                PinName::Link(_) => "link",
                PinName::Taken(_) => "pin of the program it took the hook from",
                PinName::Program(_) => "program",
            }
        )),
    }
}

/// Every entry of `pin_dir` (empty if the directory does not exist).
pub(crate) fn entries(pin_dir: &Path) -> Result<Vec<(String, PathBuf)>, Error> {
    let read = match fs::read_dir(pin_dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::Io {
                what: format!("listing {}", pin_dir.display()),
                source: e,
            })
        }
    };
    let mut out = Vec::new();
    for entry in read {
        let entry = entry.map_err(|e| Error::Io {
            what: format!("listing {}", pin_dir.display()),
            source: e,
        })?;
        out.push((
            entry.file_name().to_string_lossy().into_owned(),
            entry.path(),
        ));
    }
    out.sort();
    Ok(out)
}

/// Whether this process may open programs by id (BPF_PROG_GET_FD_BY_ID and
/// BPF_PROG_GET_NEXT_ID want CAP_SYS_ADMIN); an unreadable set counts as yes.
pub fn may_open_programs_by_id() -> bool {
    crate::host::privilege::CapSet::effective()
        .map(|caps| caps.has(crate::host::privilege::Capability::SysAdmin))
        .unwrap_or(true)
}

/// The kernel ids of the limiter's programs pinned under `pin_dir` (`prog_<id>`, each
/// checked to be a limiter program of that id).
pub fn pinned_program_ids(pin_dir: &Path) -> Vec<u32> {
    entries(pin_dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(name, path)| match parse_name(&name) {
            Some(pin @ PinName::Program(id)) if check_ours(&path, pin).is_ok() => Some(id),
            _ => None,
        })
        .collect()
}

/// Pins the program `fd` (kernel id `id`) as `prog_<id>` under `pin_dir`, unless it is
/// pinned there already. Someone else's object under that name is refused, not
/// replaced.
pub fn pin_program(pin_dir: &Path, id: u32, fd: std::os::fd::BorrowedFd<'_>) -> Result<(), Error> {
    let path = program_pin_path(pin_dir, id);
    if fs::symlink_metadata(&path).is_ok() {
        return check_ours(&path, PinName::Program(id))
            .map_err(|why| Error::PinInTheWay { path, why });
    }
    pin_fd(fd, &path).map_err(|e| Error::Io {
        what: format!("pinning the program at {}", path.display()),
        source: e,
    })
}

/// BPF_OBJ_PIN of `fd` at `path`.
pub(crate) fn pin_fd(fd: std::os::fd::BorrowedFd<'_>, path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    #[repr(C)]
    #[derive(Default)]
    struct ObjPinAttr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
        path_fd: i32,
        _pad: u32,
    }
    const BPF_OBJ_PIN: libc::c_long = 6;
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let attr = ObjPinAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd() as u32,
        ..ObjPinAttr::default()
    };
    // SAFETY: a valid BPF_OBJ_PIN attribute naming a NUL-terminated path and an open fd.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_PIN,
            &attr as *const ObjPinAttr,
            std::mem::size_of::<ObjPinAttr>(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Removes the limiter's program pins under `pin_dir` other than `keep` (an earlier
/// daemon's, once every hook runs this one's). A pin that cannot go is logged: it only
/// keeps an unused program in memory until `limiter detach`.
pub fn prune_programs(pin_dir: &Path, keep: &[u32]) {
    for id in pinned_program_ids(pin_dir) {
        if keep.contains(&id) {
            continue;
        }
        let path = program_pin_path(pin_dir, id);
        match fs::remove_file(&path) {
            Ok(()) => {
                tracing::debug!(path = %path.display(), "removed an earlier daemon's program pin")
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "an earlier daemon's program pin stays")
            }
        }
    }
}

/// The interface link pins under `pin_dir` that are the limiter's: (iface, pin).
pub fn limiter_links(pin_dir: &Path) -> Result<Vec<(String, PathBuf)>, Error> {
    Ok(entries(pin_dir)?
        .into_iter()
        .filter_map(|(name, path)| match parse_name(&name) {
            Some(PinName::Link(iface)) if check_ours(&path, PinName::Link(iface)).is_ok() => {
                Some((iface.to_string(), path))
            }
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn names_the_limiter_pins_under() {
        for map in map_name::ALL {
            assert_eq!(parse_name(map), Some(PinName::Map(map)));
        }
        assert_eq!(parse_name("link_eth0"), Some(PinName::Link("eth0")));
        assert_eq!(parse_name("taken_eth0"), Some(PinName::Taken("eth0")));
        assert_eq!(parse_name("prog_42"), Some(PinName::Program(42)));
        assert_eq!(
            parse_name("link_abcdefghijklmnop"),
            None,
            "longer than an interface name"
        );
        for foreign in [
            "link_",
            "taken_",
            "taken_abcdefghijklmnop",
            "control",
            "CONTROL.bak",
            "cilium_calls",
            "SRC_BUCKETS2",
            "prog_",
            "prog_0",
            "prog_042",
            "prog_+42",
            "prog_42x",
            "prog_4294967296",
        ] {
            assert_eq!(parse_name(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn program_names_as_the_kernel_keeps_them() {
        assert!(is_limiter_program("limiter"));
        assert!(is_limiter_program("limiter_linear"));
        assert!(is_limiter_program("limiter_tc"));
        assert!(!is_limiter_program("xdp_dispatcher"));
        assert!(!is_limiter_program("limiter2"));
    }
}
