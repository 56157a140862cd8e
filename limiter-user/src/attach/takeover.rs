//! `xdp_share_fallback = "tail-call"`: sharing the hook where the kernel refuses freplace.
//!
//! Without freplace no libxdp dispatcher runs, and libxdp itself falls back to a single
//! program attached through netlink. The limiter then does what the tail-call handoff
//! does for a load balancer that owns the hook, with the program it finds there: it pins
//! that program under pin_dir as `taken_<iface>`, makes it the `next_program` the
//! limiter tail-calls, and puts the limiter on the hook in its place with one netlink
//! request that names it (XDP_FLAGS_REPLACE), so every frame meets one program or the
//! other and the swap fails (EEXIST) if someone changed the hook meanwhile. The hook
//! stays netlink-attached, as it was: a restart replaces the limiter's own program the
//! same way, and `limiter detach` puts the taken program back.
//!
//! The handoff is one per daemon (the program's HANDOFF entry is global), so the hook
//! of one interface only can be taken over; an empty hook just gets the limiter alone.
//! Which hook is the limiter's is read from the kernel (a program using this pin_dir's
//! CONTROL map), not remembered.

use std::{
    fs,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
};

use aya::programs::{links::LinkType, loaded_links, ProgramFd, ProgramInfo};

use crate::{
    attach::{
        netlink::{self, XdpAttached, XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE},
        tc_filter,
    },
    bpf::pins::{self, taken_pin_path},
    config::XdpMode as ConfigXdpMode,
    error::Error,
    host::loaded::program_info,
};

/// What holds one interface's XDP hook, as the fallback sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    Empty,
    /// A libxdp dispatcher: joined as usual.
    Dispatcher,
    /// The limiter's own program, attached through netlink (an earlier takeover).
    Ours {
        program_id: u32,
        mode: XdpAttached,
    },
    /// The limiter's own program through a bpf_link (`xdp_share = "exclusive"`).
    OursLinked {
        program_id: u32,
    },
    Foreign {
        program_id: u32,
        name: String,
        mode: XdpAttached,
        /// Held by a bpf_link, which netlink cannot replace.
        linked: bool,
    },
}

/// What the fallback does on one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Join (or install) a libxdp dispatcher: freplace works, or a dispatcher is there.
    Join,
    /// Attach alone through netlink (empty hook, freplace refused).
    Alone,
    /// Pin this program, tail-call it, and take its place on the hook.
    Take {
        program_id: u32,
        name: String,
        mode: XdpAttached,
    },
    /// Replace the limiter's own program of an earlier takeover (restart, upgrade).
    Adopt { program_id: u32, mode: XdpAttached },
}

impl Step {
    /// Whether the limiter puts its program on the hook through netlink.
    pub fn takes_hook(&self) -> bool {
        !matches!(self, Step::Join)
    }
}

/// The step for one hook (pure). `refusal`: the kernel's refusal of freplace, `None`
/// when it accepts it.
pub fn decide(found: &Found, refusal: Option<&str>) -> Result<Step, String> {
    match (found, refusal) {
        (Found::Dispatcher, _) => Ok(Step::Join),
        // A takeover of an earlier run stays one, even on a kernel that now accepts
        // freplace: moving to a dispatcher is `limiter detach` and a new start.
        (&Found::Ours { program_id, mode }, _) => {
            if mode == XdpAttached::Other {
                return Err(format!(
                    "the limiter's program {program_id} runs there {}; the fallback shares \
                     native and generic hooks only: run `limiter detach` first",
                    mode.as_str()
                ));
            }
            Ok(Step::Adopt { program_id, mode })
        }
        (Found::OursLinked { program_id }, _) => Err(format!(
            "the limiter's own bpf_link (program {program_id}, from xdp_share = \
             \"exclusive\") holds the hook: run `limiter detach` before sharing it"
        )),
        (Found::Empty | Found::Foreign { .. }, None) => Ok(Step::Join),
        (Found::Empty, Some(_)) => Ok(Step::Alone),
        (
            Found::Foreign {
                program_id,
                name,
                mode,
                linked,
            },
            Some(refusal),
        ) => {
            if *linked {
                return Err(format!(
                    "this kernel refuses freplace ({refusal}), and program {program_id} \
                     ({name}) holds the hook through a bpf_link, which only its owner can \
                     replace, so the fallback cannot take its place. If it runs a root \
                     program array (Katran's shared mode), use join_program_array; \
                     otherwise its owner must attach it through netlink, as libxdp does"
                ));
            }
            if *mode == XdpAttached::Other {
                return Err(format!(
                    "program {program_id} ({name}) runs there {}; the fallback shares \
                     native and generic hooks only",
                    mode.as_str()
                ));
            }
            Ok(Step::Take {
                program_id: *program_id,
                name: name.clone(),
                mode: *mode,
            })
        }
    }
}

/// The steps of every configured interface together (pure): the handoff is one per
/// daemon, so a taken program (now, or in `pinned`, an earlier run's) is refused unless
/// its interface is the only one: the other interfaces' frames would go to it too.
/// Returns the interface whose taken program the limiter hands frames to, if any.
pub fn check_together<'a>(
    steps: &'a [(String, Step)],
    pinned: &[String],
) -> Result<Option<&'a str>, String> {
    let handing: Vec<&str> = steps
        .iter()
        .filter(|(iface, step)| {
            matches!(step, Step::Take { .. })
                || (matches!(step, Step::Adopt { .. }) && pinned.contains(iface))
        })
        .map(|(iface, _)| iface.as_str())
        .collect();
    match handing[..] {
        [] => Ok(None),
        [one] if steps.len() == 1 => Ok(Some(one)),
        _ => Err(format!(
            "the fallback hands frames over to the program it took from the hook, and the \
             limiter has one handoff for all its interfaces: with {} configured, the frames \
             of the others would go to that program too. Run one daemon (own pin_dir and \
             control_socket) per interface whose hook holds another program",
            steps
                .iter()
                .map(|(i, _)| i.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// What the fallback does on every configured interface, decided at start.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub steps: Vec<(String, Step)>,
    /// The interface whose taken program the limiter hands frames to.
    pub handing: Option<String>,
}

impl Plan {
    /// The step for `iface` (`Join` when the fallback is not in use there).
    pub fn step(&self, iface: &str) -> Step {
        self.steps
            .iter()
            .find(|(i, _)| i == iface)
            .map_or(Step::Join, |(_, s)| s.clone())
    }

    /// The handoff to the taken program, as if configured with `next_program`.
    pub fn handoff(&self, pin_dir: &Path) -> Option<crate::config::HandoffSpec> {
        self.handing
            .as_ref()
            .map(|iface| crate::config::HandoffSpec::Program(taken_pin_path(pin_dir, iface)))
    }

    /// Removes the pins [`plan`] made, when the start fails before the takeover.
    pub fn undo(&self, pin_dir: &Path) {
        for (iface, step) in &self.steps {
            undo_prepare(pin_dir, iface, step);
        }
    }
}

/// Reads every configured interface's hook and decides (the kernel's freplace verdict is
/// probed once), then pins the programs to take over. Refused, with nothing changed, when
/// a hook cannot be shared this way.
pub fn plan(pin_dir: &Path, ifaces: &[String]) -> Result<Plan, Error> {
    let control = tc_filter::control_map_id(pin_dir);
    let refusal = crate::attach::libxdp::freplace_refusal();
    if let Some(why) = &refusal {
        tracing::warn!(refusal = %why, "this kernel refuses freplace: no libxdp dispatcher can run; xdp_share_fallback = \"tail-call\" takes the hooks over instead");
    }
    let mut steps = Vec::new();
    for iface in ifaces {
        let ifindex = crate::attach::netlink::ifindex_of(iface)?;
        let found = inspect(iface, ifindex, control)?;
        let step = decide(&found, refusal.as_deref()).map_err(|r| sharing(iface, r))?;
        steps.push((iface.clone(), step));
    }
    let pinned: Vec<String> = taken_pins(pin_dir);
    let handing = check_together(&steps, &pinned)
        .map_err(|r| sharing(&ifaces.join(", "), r))?
        .map(str::to_string);
    // A taken program's pin outlives a takeover only while the limiter holds that hook:
    // one left beside any other step would put back a program someone removed.
    for iface in &pinned {
        let step = steps.iter().find(|(i, _)| i == iface).map(|(_, s)| s);
        if !matches!(step, Some(Step::Adopt { .. })) && ifaces.contains(iface) {
            let pin = taken_pin_path(pin_dir, iface);
            pins::check_ours(&pin, pins::PinName::Taken(iface)).map_err(|why| {
                Error::PinInTheWay {
                    path: pin.clone(),
                    why,
                }
            })?;
            tracing::warn!(%iface, pin = %pin.display(), "the hook no longer runs the limiter since it took it over: the program pinned there is no longer handed frames (pin removed)");
            fs::remove_file(&pin).map_err(|e| Error::Io {
                what: format!("removing {}", pin.display()),
                source: e,
            })?;
        }
    }
    let plan = Plan { steps, handing };
    for (iface, step) in &plan.steps {
        if let Err(e) = prepare(pin_dir, iface, step) {
            plan.undo(pin_dir);
            return Err(e);
        }
    }
    Ok(plan)
}

/// Gives back every hook the limiter holds under this pin_dir except on `keep`'s
/// interfaces (no longer configured, or the fallback is no longer on). Returns each
/// interface with what was done.
pub fn give_back_unconfigured(
    pin_dir: &Path,
    keep: &[String],
) -> Result<Vec<(String, String)>, Error> {
    let Some(control) = tc_filter::control_map_id(pin_dir) else {
        return Ok(Vec::new());
    };
    let mut done = Vec::new();
    for (iface, ifindex) in held_interfaces(pin_dir, Some(control))? {
        if keep.contains(&iface) {
            continue;
        }
        if ifindex == 0 {
            let pin = taken_pin_path(pin_dir, &iface);
            let _ = fs::remove_file(&pin);
            let what = format!("{iface}: removed {} (no such interface)", pin.display());
            done.push((iface, what));
            continue;
        }
        if let Some(what) = give_back(pin_dir, &iface, ifindex, control)? {
            done.push((iface, what));
        }
    }
    Ok(done)
}

/// Why [`program_info`] found no `program_id`: without CAP_SYS_ADMIN the kernel lists no
/// program by id at all (BPF_PROG_GET_NEXT_ID / GET_FD_BY_ID), so say that rather than
/// that the program went away.
fn vanished(iface: &str, program_id: u32) -> Error {
    let admin = crate::host::privilege::CapSet::effective()
        .map(|caps| caps.has(crate::host::privilege::Capability::SysAdmin))
        .unwrap_or(true);
    if admin {
        sharing(
            iface,
            format!("program {program_id} left the hook while the limiter was taking it"),
        )
    } else {
        Error::Permission(crate::host::privilege::PermissionError::Refused {
            doing: format!("{iface}: taking the hook over from program {program_id}"),
            cap: crate::host::privilege::Capability::SysAdmin,
        })
    }
}

/// Whether an XDP bpf_link runs `program_id` (netlink cannot replace such a hook).
fn held_by_link(program_id: u32) -> bool {
    loaded_links()
        .filter_map(Result::ok)
        .any(|l| l.program_id() == program_id && l.link_type().ok() == Some(LinkType::Xdp))
}

/// Reads the hook of `iface` for [`decide`]. `control_id`: the pinned CONTROL map, which
/// marks the limiter's programs.
pub fn inspect(iface: &str, ifindex: u32, control_id: Option<u32>) -> Result<Found, Error> {
    Ok(
        match crate::attach::libxdp::inspect(iface, ifindex, control_id)? {
            crate::attach::libxdp::Hook::Empty => Found::Empty,
            crate::attach::libxdp::Hook::Dispatcher(_) => Found::Dispatcher,
            crate::attach::libxdp::Hook::Other {
                program_id,
                name,
                mode,
            } => {
                let linked = held_by_link(program_id);
                let ours = control_id.is_some_and(|c| tc_filter::program_uses_map(program_id, c));
                match (ours, linked) {
                    (true, true) => Found::OursLinked { program_id },
                    (true, false) => Found::Ours { program_id, mode },
                    (false, linked) => Found::Foreign {
                        program_id,
                        name,
                        mode,
                        linked,
                    },
                }
            }
        },
    )
}

fn sharing(iface: &str, reason: String) -> Error {
    Error::Sharing {
        iface: iface.to_string(),
        reason,
    }
}

/// Before the limiter runs anywhere: pins the program of a [`Step::Take`] as
/// `taken_<iface>` (replacing a stale pin of an earlier, unfinished takeover), so the
/// handoff can follow it. Nothing else changes; [`undo_prepare`] removes the pin again if
/// the takeover does not happen.
pub fn prepare(pin_dir: &Path, iface: &str, step: &Step) -> Result<(), Error> {
    let Step::Take { program_id, .. } = step else {
        return Ok(());
    };
    let pin = taken_pin_path(pin_dir, iface);
    if fs::symlink_metadata(&pin).is_ok() {
        pins::check_ours(&pin, pins::PinName::Taken(iface)).map_err(|why| Error::PinInTheWay {
            path: pin.clone(),
            why,
        })?;
        fs::remove_file(&pin).map_err(|e| Error::Io {
            what: format!("removing the stale pin {}", pin.display()),
            source: e,
        })?;
    }
    let info = program_info(*program_id).ok_or_else(|| vanished(iface, *program_id))?;
    let fd = info.fd().map_err(|e| Error::Program {
        what: format!("opening program {program_id}"),
        source: Box::new(e),
    })?;
    pin_program(&fd, &pin)
}

fn pin_program(fd: &ProgramFd, pin: &Path) -> Result<(), Error> {
    crate::bpf::pins::pin_fd(fd.as_fd(), pin).map_err(|e| Error::Link {
        what: format!("pinning the taken program at {}", pin.display()),
        reason: e.to_string(),
    })
}

/// Removes the pin [`prepare`] made, when the takeover did not happen.
pub fn undo_prepare(pin_dir: &Path, iface: &str, step: &Step) {
    if matches!(step, Step::Take { .. }) {
        let _ = fs::remove_file(taken_pin_path(pin_dir, iface));
    }
}

/// Puts `ours` on the hook of `iface` as `step` says: in place of the program found
/// there (taken or the limiter's own), or alone on an empty hook. Returns the mode.
pub fn attach(
    iface: &str,
    ifindex: u32,
    step: &Step,
    mode: ConfigXdpMode,
    ours: &ProgramFd,
) -> Result<XdpAttached, Error> {
    let replace = |program_id: u32, found_mode: XdpAttached| -> Result<XdpAttached, Error> {
        let wanted = match mode {
            ConfigXdpMode::Native => Some(XdpAttached::Native),
            ConfigXdpMode::Generic => Some(XdpAttached::Generic),
            _ => None,
        };
        if wanted.is_some_and(|w| w != found_mode) {
            return Err(sharing(
                iface,
                format!(
                    "program {program_id} runs there in {} mode and xdp_mode = \"{}\": the \
                     limiter takes its place in the same mode; set xdp_mode = \"auto\" or \
                     \"{}\"",
                    found_mode.as_str(),
                    mode.as_str(),
                    found_mode.as_str()
                ),
            ));
        }
        let old = program_info(program_id)
            .and_then(|p| p.fd().ok())
            .ok_or_else(|| vanished(iface, program_id))?;
        netlink::set_xdp(
            ifindex,
            ours.as_fd().as_raw_fd(),
            found_mode.flag(),
            Some(old.as_fd().as_raw_fd()),
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EEXIST) => sharing(
                iface,
                format!(
                    "another program replaced program {program_id} while the limiter was \
                     taking its place ({e}); nothing changed, start again"
                ),
            ),
            Some(libc::EBUSY) => sharing(
                iface,
                format!("a bpf_link holds the hook ({e}), which netlink cannot replace"),
            ),
            // Another build may fare better (the MTU needs the multi-buffer one).
            _ => Error::Link {
                what: format!("{iface}: replacing program {program_id}"),
                reason: e.to_string(),
            },
        })?;
        Ok(found_mode)
    };
    let _lock = crate::attach::libxdp::Lock::acquire()?;
    match step {
        Step::Join => Err(Error::AttachPlan {
            iface: iface.to_string(),
            what: "asked to attach through netlink where the plan is to join a libxdp \
                   dispatcher",
        }),
        Step::Take {
            program_id, mode, ..
        }
        | Step::Adopt { program_id, mode } => replace(*program_id, *mode),
        Step::Alone => {
            let flags: &[(u32, XdpAttached)] = match mode {
                ConfigXdpMode::Native => &[(XDP_FLAGS_DRV_MODE, XdpAttached::Native)],
                ConfigXdpMode::Generic => &[(XDP_FLAGS_SKB_MODE, XdpAttached::Generic)],
                _ => &[
                    (XDP_FLAGS_DRV_MODE, XdpAttached::Native),
                    (XDP_FLAGS_SKB_MODE, XdpAttached::Generic),
                ],
            };
            let mut last = String::new();
            for &(flag, attached) in flags {
                match netlink::set_xdp(
                    ifindex,
                    ours.as_fd().as_raw_fd(),
                    flag | netlink::XDP_FLAGS_UPDATE_IF_NOEXIST,
                    None,
                ) {
                    Ok(()) => return Ok(attached),
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        return Err(sharing(
                            iface,
                            format!(
                                "a program took the hook while the limiter was attaching \
                                 ({e}); nothing changed, start again"
                            ),
                        ))
                    }
                    Err(e) => last = format!("{} mode: {e}", attached.as_str()),
                }
            }
            Err(Error::Link {
                what: format!("attaching to {iface} through netlink"),
                reason: last,
            })
        }
    }
}

/// What [`give_back`] did on one interface, for the operator.
pub fn describe_give_back(iface: &str, restored: Option<&str>) -> String {
    match restored {
        Some(name) => format!("{iface}: gave the XDP hook back to {name}"),
        None => format!("{iface}: took the limiter off the XDP hook"),
    }
}

/// Takes the limiter off the hook of `iface` where it took the hook over: the taken
/// program goes back in its place (the same atomic replacement), or the hook is emptied
/// when it was empty; then the `taken_<iface>` pin goes. A hook that no longer holds the
/// limiter's program is left as it is. Returns what was done (`None`: nothing to do).
pub fn give_back(
    pin_dir: &Path,
    iface: &str,
    ifindex: u32,
    control_id: u32,
) -> Result<Option<String>, Error> {
    let pin = taken_pin_path(pin_dir, iface);
    let taken = if fs::symlink_metadata(&pin).is_ok() {
        pins::check_ours(&pin, pins::PinName::Taken(iface)).map_err(|why| Error::PinInTheWay {
            path: pin.clone(),
            why,
        })?;
        Some(ProgramInfo::from_pin(&pin).map_err(|e| Error::Program {
            what: format!("reading the taken program {}", pin.display()),
            source: Box::new(e),
        })?)
    } else {
        None
    };
    let _lock = crate::attach::libxdp::Lock::acquire()?;
    let done = match inspect(iface, ifindex, Some(control_id))? {
        Found::Ours { program_id, mode } => {
            let ours = program_info(program_id)
                .and_then(|p| p.fd().ok())
                .ok_or_else(|| {
                    sharing(
                        iface,
                        format!("program {program_id} left the hook meanwhile"),
                    )
                })?;
            let (fd, name) = match &taken {
                Some(info) => (
                    Some(info.fd().map_err(|e| Error::Program {
                        what: format!("opening the taken program {}", pin.display()),
                        source: Box::new(e),
                    })?),
                    Some(format!(
                        "program {} ({})",
                        info.id(),
                        info.name_as_str().unwrap_or("?")
                    )),
                ),
                None => (None, None),
            };
            netlink::set_xdp(
                ifindex,
                fd.as_ref().map_or(-1, |fd| fd.as_fd().as_raw_fd()),
                mode.flag(),
                Some(ours.as_fd().as_raw_fd()),
            )
            .map_err(|e| Error::Link {
                what: format!("{iface}: giving the XDP hook back"),
                reason: e.to_string(),
            })?;
            Some(describe_give_back(iface, name.as_deref()))
        }
        _ if taken.is_some() => {
            tracing::warn!(%iface, pin = %pin.display(), "the hook no longer runs the limiter: left as it is; the taken program's pin goes");
            Some(format!(
                "{iface}: removed {} (the hook no longer ran the limiter)",
                pin.display()
            ))
        }
        _ => None,
    };
    if taken.is_some() {
        fs::remove_file(&pin).map_err(|e| Error::Io {
            what: format!("removing {}", pin.display()),
            source: e,
        })?;
    }
    Ok(done)
}

/// Interfaces where the limiter holds the hook through netlink, or left a taken
/// program's pin: (iface, ifindex).
pub fn held_interfaces(
    pin_dir: &Path,
    control_id: Option<u32>,
) -> Result<Vec<(String, u32)>, Error> {
    let mut out = Vec::new();
    if let Some(control) = control_id {
        let interfaces = tc_filter::interfaces().map_err(|e| Error::Io {
            what: "listing interfaces".into(),
            source: e,
        })?;
        for (iface, ifindex) in interfaces {
            if let Ok(Found::Ours { .. }) = inspect(&iface, ifindex, Some(control)) {
                out.push((iface, ifindex));
            }
        }
    }
    for iface in taken_pins(pin_dir) {
        if out.iter().any(|(i, _)| *i == iface) {
            continue;
        }
        // An interface that went away: its pin goes with ifindex 0 (nothing to give back).
        let ifindex = tc_filter::interfaces()
            .ok()
            .and_then(|all| all.into_iter().find(|(i, _)| *i == iface))
            .map_or(0, |(_, index)| index);
        out.push((iface, ifindex));
    }
    Ok(out)
}

/// Interfaces with a `taken_<iface>` pin under pin_dir.
pub fn taken_pins(pin_dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(pin_dir) else {
        return Vec::new();
    };
    let mut out: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            match pins::parse_name(&name) {
                Some(pins::PinName::Taken(iface)) => Some(iface.to_string()),
                _ => None,
            }
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    const REFUSED: Option<&str> = Some("EPERM");

    fn foreign(linked: bool, mode: XdpAttached) -> Found {
        Found::Foreign {
            program_id: 7,
            name: "xdpfilt_alw_all".into(),
            mode,
            linked,
        }
    }

    #[test]
    fn the_fallback_acts_only_where_freplace_is_refused() {
        for found in [
            Found::Empty,
            Found::Dispatcher,
            foreign(false, XdpAttached::Native),
        ] {
            assert_eq!(decide(&found, None), Ok(Step::Join), "{found:?}");
        }
        assert_eq!(decide(&Found::Dispatcher, REFUSED), Ok(Step::Join));
        assert_eq!(decide(&Found::Empty, REFUSED), Ok(Step::Alone));
        assert_eq!(
            decide(&foreign(false, XdpAttached::Generic), REFUSED),
            Ok(Step::Take {
                program_id: 7,
                name: "xdpfilt_alw_all".into(),
                mode: XdpAttached::Generic
            })
        );
    }

    #[test]
    fn an_earlier_takeover_is_adopted_whatever_the_kernel_says_now() {
        let ours = Found::Ours {
            program_id: 9,
            mode: XdpAttached::Native,
        };
        for refusal in [None, REFUSED] {
            assert_eq!(
                decide(&ours, refusal),
                Ok(Step::Adopt {
                    program_id: 9,
                    mode: XdpAttached::Native
                })
            );
        }
    }

    #[test]
    fn what_netlink_cannot_replace_is_refused_with_the_reason() {
        let e = decide(&foreign(true, XdpAttached::Native), REFUSED).unwrap_err();
        assert!(
            e.contains("bpf_link") && e.contains("xdpfilt_alw_all"),
            "{e}"
        );
        let e = decide(&foreign(false, XdpAttached::Other), REFUSED).unwrap_err();
        assert!(e.contains("offloaded"), "{e}");
        let e = decide(&Found::OursLinked { program_id: 3 }, REFUSED).unwrap_err();
        assert!(e.contains("limiter detach"), "{e}");
    }

    #[test]
    fn a_taken_program_needs_its_interface_alone() {
        let take = Step::Take {
            program_id: 7,
            name: "lb".into(),
            mode: XdpAttached::Native,
        };
        let adopt = Step::Adopt {
            program_id: 9,
            mode: XdpAttached::Native,
        };
        let one = [("veth0".to_string(), take.clone())];
        assert_eq!(check_together(&one, &[]), Ok(Some("veth0")));
        let alone = [
            ("veth0".to_string(), Step::Alone),
            ("veth1".to_string(), adopt.clone()),
        ];
        assert_eq!(check_together(&alone, &[]), Ok(None));
        // An earlier run's taken program counts as one.
        let e = check_together(&alone, &["veth1".to_string()]).unwrap_err();
        assert!(e.contains("veth0, veth1"), "{e}");
        let two = [
            ("veth0".to_string(), take),
            ("veth1".to_string(), Step::Alone),
        ];
        assert!(check_together(&two, &[]).is_err());
        let adopted = [("veth0".to_string(), adopt)];
        assert_eq!(
            check_together(&adopted, &["veth0".to_string()]),
            Ok(Some("veth0"))
        );
    }
}
