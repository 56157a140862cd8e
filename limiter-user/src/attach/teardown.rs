//! Undoing everything the limiter did on this host, in the order that keeps no program
//! running on maps that are gone: the LB slots it joined, its TC filters, the hooks it
//! took over (given back), its libxdp components, its links, then its maps and the pin
//! directory. `limiter detach` and `--detach-on-exit` end here; anything under pin_dir
//! that is not the limiter's stays, and is reported.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::{
    attach::{handoff, libxdp, takeover, tc_filter},
    bpf::pins::{check_ours, entries, parse_name, taken_pin_path, PinName},
    error::Error,
};

/// What [`remove_pins`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cleanup {
    pub removed: Vec<PathBuf>,
    /// The limiter's cls_bpf filters (TC mode on kernels without tcx) and libxdp
    /// dispatcher components removed: which interface, which hook.
    pub removed_filters: Vec<String>,
    /// What was left in place, and why it is not the limiter's.
    pub left: Vec<(PathBuf, String)>,
    /// Prog array slots the limiter was in (`join_program_array`), emptied.
    pub removed_slots: Vec<String>,
    /// Hooks the limiter had taken over (`xdp_share_fallback`), given back.
    pub gave_back: Vec<String>,
}

/// Removes what the limiter pinned under `pin_dir`: its links first (enforcement stops
/// on every interface), then its maps, then the directory if nothing else is in it.
/// Anything else is left where it is and reported.
pub fn remove_pins(pin_dir: &Path) -> Result<Cleanup, Error> {
    let mut cleanup = Cleanup::default();
    let mut links = Vec::new();
    let mut maps = Vec::new();
    for (name, path) in entries(pin_dir)? {
        match parse_name(&name) {
            None => cleanup
                .left
                .push((path, "not a name the limiter pins under".into())),
            Some(pin) => match check_ours(&path, pin) {
                Err(why) => cleanup.left.push((path, why)),
                Ok(()) if matches!(pin, PinName::Link(_)) => links.push(path),
                // Removed as the hook is given back, below.
                Ok(()) if matches!(pin, PinName::Taken(_)) => {}
                Ok(()) => maps.push(path),
            },
        }
    }
    // Filters and links before maps: one removed last would keep the program running
    // on maps that no longer have a name. A filter is found by the maps its program
    // uses, so it must go while they are still pinned.
    let filters = tc_filter::limiter_filters(pin_dir).map_err(|e| Error::Io {
        what: "listing the interfaces' TC filters".into(),
        source: e,
    })?;
    // The same for the LB slots the limiter joined: they run the program without a pin.
    if let Some(control) = tc_filter::control_map_id(pin_dir) {
        cleanup.removed_slots = handoff::leave_prog_arrays(control)?;
    }
    for (iface, filter) in filters {
        tc_filter::remove(&iface, &filter).map_err(|reason| Error::Link {
            what: format!("removing the limiter's {} from {iface}", filter.describe()),
            reason,
        })?;
        cleanup
            .removed_filters
            .push(format!("{iface}: {}", filter.describe()));
    }
    // The hooks taken over (netlink-attached, no pin of their own) are found the same
    // way; each gets its program back before the maps go.
    let control = tc_filter::control_map_id(pin_dir);
    for (iface, ifindex) in takeover::held_interfaces(pin_dir, control)? {
        let done = match control {
            Some(control) if ifindex != 0 => {
                takeover::give_back(pin_dir, &iface, ifindex, control)?
            }
            _ => {
                let pin = taken_pin_path(pin_dir, &iface);
                fs::remove_file(&pin).map_err(|e| Error::Io {
                    what: format!("removing {}", pin.display()),
                    source: e,
                })?;
                Some(format!(
                    "{iface}: removed {} (no such interface)",
                    pin.display()
                ))
            }
        };
        cleanup.gave_back.extend(done);
    }
    // Dispatcher components are found the same way.
    for (iface, ifindex) in libxdp::joined_interfaces(pin_dir)? {
        let Some(control) = tc_filter::control_map_id(pin_dir) else {
            break;
        };
        libxdp::leave(&iface, ifindex, control)?;
        cleanup.removed_filters.push(format!(
            "{iface}: the limiter's libxdp dispatcher component"
        ));
    }
    for path in links.into_iter().chain(maps) {
        fs::remove_file(&path).map_err(|e| Error::Io {
            what: format!("removing {}", path.display()),
            source: e,
        })?;
        cleanup.removed.push(path);
    }
    if cleanup.left.is_empty() && pin_dir.exists() {
        // Best effort: the pins are gone, which is what stops enforcement. A directory
        // that cannot go (a mount point such as /sys/fs/bpf itself) is reported, kept.
        if let Err(e) = fs::remove_dir(pin_dir) {
            cleanup
                .left
                .push((pin_dir.to_path_buf(), format!("the directory stays: {e}")));
        }
    }
    for (path, why) in &cleanup.left {
        tracing::warn!(path = %path.display(), "left in place: {why}");
    }
    Ok(cleanup)
}
