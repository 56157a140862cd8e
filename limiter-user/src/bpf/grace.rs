//! Waiting until no program run still reads what the daemon just replaced.
//!
//! XDP and TC programs run inside an RCU read-side section, so once an RCU grace period
//! has passed after the generation flip, no frame is still being decided with the table
//! it replaced. Userspace has no `synchronize_rcu()` of its own, but the kernel calls it
//! on every update of a map-in-map (`maybe_wait_bpf_programs()` in kernel/bpf/syscall.c,
//! since Linux 4.14, "so that userspace, when we return to it, knows that all programs
//! that could be running use the new map value"). A throwaway ARRAY_OF_MAPS of one entry,
//! never seen by any program, gives the daemon that wait.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_TYPE_ARRAY_OF_MAPS: u32 = 12;

/// The leading fields of `union bpf_attr` for BPF_MAP_CREATE, zero-padded (the kernel
/// refuses nonzero bytes past the fields it knows).
#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    rest: [u32; 26],
}

#[repr(C)]
#[derive(Default)]
struct MapUpdate {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a zero-padded bpf_attr prefix of the right layout for `cmd`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as u32,
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ret)
}

fn create(map_type: u32, inner: Option<&OwnedFd>) -> std::io::Result<OwnedFd> {
    let mut attr = MapCreate {
        map_type,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        inner_map_fd: inner.map_or(0, |fd| fd.as_raw_fd() as u32),
        ..MapCreate::default()
    };
    let fd = bpf(BPF_MAP_CREATE, &mut attr)?;
    // SAFETY: the descriptor the kernel just returned; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Returns once every program run that began before the call has finished (one RCU
/// grace period: milliseconds).
pub fn wait_for_running_programs() -> std::io::Result<()> {
    let inner = create(BPF_MAP_TYPE_ARRAY, None)?;
    let outer = create(BPF_MAP_TYPE_ARRAY_OF_MAPS, Some(&inner))?;
    let key: u32 = 0;
    let value: u32 = inner.as_raw_fd() as u32;
    let mut attr = MapUpdate {
        map_fd: outer.as_raw_fd() as u32,
        key: &key as *const u32 as u64,
        value: &value as *const u32 as u64,
        ..MapUpdate::default()
    };
    // The update returns after synchronize_rcu().
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}
