//! The tail-call handoff: frames the limiter passes go on to the program that runs after
//! it (`next_program`), or the limiter sits in a slot of the LB's root array and calls on
//! to the slots after it (`join_program_array`).
//!
//! The kernel side is one map of settings (`HANDOFF`: first slot, how many slots) and one
//! prog array per XDP build (`HANDOFF_LINEAR`, `HANDOFF_MULTI`): the kernel gives a prog
//! array to the type and `xdp.frags` flag of its first user and refuses tail calls across
//! either. In `next_program = "PIN"` mode both arrays are the daemon's own one-slot
//! arrays, and the daemon puts the program pinned at PIN into each one that accepts it.
//! With the LB's array (`PIN:INDEX`, `join_program_array`) the loader opens the LB's pin
//! as `HANDOFF_LINEAR`: the single-buffer build tail-calls through the LB's own array,
//! so whatever the LB puts in the slot gets the next frame. Katran's programs are plain
//! XDP programs; the multi-buffer build keeps its own (empty) array and fails open.

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    path::{Path, PathBuf},
};

use aya::{
    maps::{Map, MapData, MapInfo, MapType, ProgramArray},
    programs::ProgramInfo,
};
use limiter_common::abi::{Handoff, MAX_HANDOFF_SLOTS};
use serde::Serialize;

use crate::{
    config::HandoffSpec,
    error::Error,
    host::{loaded::program_info, object::Variant},
};

/// What the LB's pinned prog array looks like (read before the program is loaded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LbArray {
    pub id: u32,
    pub max_entries: u32,
}

/// Checks that `path` holds a pinned prog array (never creates one: the loader would
/// pin a new, empty array of ours at the LB's path if nothing were there).
pub fn check_lb_array(key: &'static str, path: &Path) -> Result<LbArray, Error> {
    let err = |reason: String| Error::Handoff { key, reason };
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| err(format!("{}: {e} (is the LB running?)", path.display())))?;
    if !meta.is_file() {
        return Err(err(format!(
            "{} is a {}, not a pinned BPF map",
            path.display(),
            limiter_instance::kind_of(meta.file_type())
        )));
    }
    // The info call answers for whatever the pin holds (a program's info read as a
    // map's would name a random map type): ask what it is first.
    match crate::bpf::pins::object_kind(path) {
        Ok(crate::bpf::pins::Object::Map) => {}
        Ok(other) => {
            return Err(err(format!(
                "{} is not a pinned BPF map but a {} (a program pin is next_program = \"PIN\", \
                 without :INDEX)",
                path.display(),
                match other {
                    crate::bpf::pins::Object::Program => "pinned program".to_string(),
                    crate::bpf::pins::Object::Link => "pinned link".to_string(),
                    crate::bpf::pins::Object::Other(what) => what,
                    crate::bpf::pins::Object::Map => "map".to_string(),
                }
            )))
        }
        Err(e) => {
            return Err(err(format!(
                "{} is not a pinned BPF object ({e})",
                path.display()
            )))
        }
    }
    let info = MapInfo::from_pin(path)
        .map_err(|e| err(format!("{} is not a pinned BPF map ({e})", path.display())))?;
    match info.map_type() {
        Ok(MapType::ProgramArray) => {}
        Ok(other) => {
            return Err(err(format!(
                "{} is a {other:?} map, not a prog array (BPF_MAP_TYPE_PROG_ARRAY)",
                path.display()
            )))
        }
        Err(e) => return Err(err(format!("{}: {e}", path.display()))),
    }
    Ok(LbArray {
        id: info.id(),
        max_entries: info.max_entries(),
    })
}

/// The `HANDOFF` entry for a config (pure). `lb_entries`: the LB array's size, for the
/// modes that use it. A slot outside the array is an error naming the array's size.
pub fn plan(spec: Option<&HandoffSpec>, lb_entries: Option<u32>) -> Result<Handoff, String> {
    let Some(spec) = spec else {
        return Ok(Handoff::default());
    };
    let entries = lb_entries.unwrap_or(1);
    let in_array = |index: u32| {
        if index < entries {
            Ok(())
        } else {
            Err(format!(
                "slot {index} is outside the array (it has {entries} slots, 0 to {})",
                entries.saturating_sub(1)
            ))
        }
    };
    Ok(match spec {
        HandoffSpec::Program(_) => Handoff { first: 0, slots: 1 },
        HandoffSpec::Slot { index, .. } => {
            in_array(*index)?;
            Handoff {
                first: *index,
                slots: 1,
            }
        }
        HandoffSpec::Join { index, .. } => {
            in_array(*index)?;
            // The slots after ours, in order, as the LB's root tries its slots.
            let first = index + 1;
            Handoff {
                first,
                slots: entries.saturating_sub(first).min(MAX_HANDOFF_SLOTS),
            }
        }
    })
}

/// The program id in slot `index` of a prog array, `None` if the slot is empty.
pub fn slot_program(map: &MapData, index: u32) -> Result<Option<u32>, std::io::Error> {
    #[repr(C)]
    struct LookupAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
    let mut value = 0u32;
    let attr = LookupAttr {
        map_fd: map.fd().as_fd().as_raw_fd() as u32,
        _pad: 0,
        key: &index as *const u32 as u64,
        value: &mut value as *mut u32 as u64,
        flags: 0,
    };
    // SAFETY: a valid BPF_MAP_LOOKUP_ELEM attribute; key and value outlive the call. A
    // prog array's lookup from user space writes the program's id (4 bytes).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_ELEM,
            &attr as *const LookupAttr,
            std::mem::size_of::<LookupAttr>(),
        )
    };
    if rc == 0 {
        return Ok(Some(value));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENOENT) {
        Ok(None)
    } else {
        Err(e)
    }
}

/// A loaded program's name, by id (`None` if it is gone).
pub fn program_name(id: u32) -> Option<String> {
    program_info(id).map(|p| p.name_as_str().unwrap_or("?").to_string())
}

fn prog_array(data: MapData, what: &str) -> Result<ProgramArray<MapData>, Error> {
    ProgramArray::try_from(Map::ProgramArray(data)).map_err(|source| Error::Map {
        what: format!("opening {what} as a prog array"),
        source,
    })
}

/// Opens a pinned prog array with its real size (aya checks indices against it).
pub fn open_array(path: &Path) -> Result<(MapData, ProgramArray<MapData>), Error> {
    let open = || {
        MapData::from_pin(path).map_err(|source| Error::Map {
            what: format!("opening the prog array {}", path.display()),
            source,
        })
    };
    Ok((open()?, prog_array(open()?, &path.display().to_string())?))
}

/// How frames the limiter passes on one interface (or from the LB's slot) are handed
/// over, for `limiter status`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct HandoffStatus {
    /// The config line (`next_program = "…"`).
    pub config: String,
    /// "program pin", "LB array slot" or "joined LB root array".
    pub how: &'static str,
    /// The prog array the running build tail-calls through, and its slots.
    pub array: String,
    pub first_slot: u32,
    pub slots: u32,
    /// The program the first non-empty slot holds now; `None`: missing (frames pass).
    pub program_id: Option<u32>,
    pub program_name: Option<String>,
    /// Why frames fail open, when they do.
    pub missing: Option<String>,
    /// Frames passed because the next program was missing (all CPUs, since first load).
    pub missing_frames: u64,
    /// Something the operator must act on although frames are handed over (the LB
    /// re-created its array: the limiter still uses the old one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// `join_program_array`: whether the joined slot holds the limiter now (another tool
    /// may have written it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot_holds_limiter: Option<bool>,
}

/// The daemon's side of the handoff: the arrays it writes and what it wrote.
pub struct HandoffControl {
    spec: Option<HandoffSpec>,
    pin_dir: PathBuf,
    /// The daemon's own arrays (`next_program = "PIN"`), pinned under pin_dir.
    /// Each with a second handle for lookups (aya's ProgramArray hides its map).
    own: [Option<(MapData, ProgramArray<MapData>)>; 2],
    /// `next_program = "PIN"`: the program id put into the own arrays, and which builds'
    /// arrays accepted it.
    followed: Option<(u32, [bool; 2])>,
    /// The LB's array (`PIN:INDEX`, `join_program_array`), opened at its real size.
    lb: Option<(PathBuf, MapData, ProgramArray<MapData>)>,
    /// `join_program_array`: the slot this daemon wrote the limiter into.
    joined: Option<u32>,
    /// The id of the program this daemon wrote there (read back after the write).
    joined_id: Option<u32>,
    /// `next_program = "PIN"` names the limiter itself (this id): refused.
    self_reference: Option<u32>,
    /// The LB's pin now names another map than the one the program was loaded with.
    lb_replaced: Option<String>,
}

fn variant_index(v: Variant) -> usize {
    match v {
        Variant::MultiBuffer => 1,
        _ => 0,
    }
}

impl HandoffControl {
    /// `own`: the program's HANDOFF_LINEAR and HANDOFF_MULTI when they are the daemon's
    /// own (`None` for one that is the LB's array).
    pub fn new(
        spec: Option<HandoffSpec>,
        pin_dir: &Path,
        own: [Option<MapData>; 2],
    ) -> Result<HandoffControl, Error> {
        let [a, b] = own;
        let with_handle = |m: MapData, name: &str| -> Result<_, Error> {
            // A second descriptor of the same map, duplicated rather than looked up by
            // id: BPF_MAP_GET_FD_BY_ID would need CAP_SYS_ADMIN, which the daemon does
            // not otherwise need (README, "Running under systemd").
            let fd = m.fd().as_fd().try_clone_to_owned().map_err(|e| Error::Io {
                what: format!("duplicating the descriptor of {name}"),
                source: e,
            })?;
            let handle = MapData::from_fd(fd).map_err(|source| Error::Map {
                what: format!("reopening {name}"),
                source,
            })?;
            Ok((handle, prog_array(m, name)?))
        };
        let own = [
            a.map(|m| with_handle(m, "HANDOFF_LINEAR")).transpose()?,
            b.map(|m| with_handle(m, "HANDOFF_MULTI")).transpose()?,
        ];
        let lb = match spec.as_ref().and_then(HandoffSpec::lb_array) {
            Some(path) => {
                let (data, array) = open_array(path)?;
                Some((path.to_path_buf(), data, array))
            }
            None => None,
        };
        Ok(HandoffControl {
            spec,
            pin_dir: pin_dir.to_path_buf(),
            own,
            followed: None,
            lb,
            joined: None,
            joined_id: None,
            self_reference: None,
            lb_replaced: None,
        })
    }

    pub fn spec(&self) -> Option<&HandoffSpec> {
        self.spec.as_ref()
    }

    /// A new config for the same arrays ([`live_change`] said it is possible).
    pub fn set_spec(&mut self, spec: Option<HandoffSpec>) {
        if !matches!(spec, Some(HandoffSpec::Program(_))) {
            self.clear_own();
        }
        self.followed = None;
        self.spec = spec;
    }

    /// The `HANDOFF` entry this control's config calls for.
    pub fn plan(&self) -> Result<Handoff, Error> {
        self.plan_for(self.spec.as_ref())
    }

    /// The `HANDOFF` entry `spec` would call for with this control's arrays.
    pub fn plan_for(&self, spec: Option<&HandoffSpec>) -> Result<Handoff, Error> {
        let entries = self
            .lb
            .as_ref()
            .map(|(_, d, _)| d.info().map(|i| i.max_entries()).unwrap_or(0));
        plan(spec, entries).map_err(|reason| Error::Handoff {
            key: spec.map_or("next_program", HandoffSpec::key),
            reason,
        })
    }

    /// `next_program = "PIN"`: (re)reads the pin and puts the program it names into the
    /// daemon's arrays (one atomic slot update each: a frame sees the old program or the
    /// new one). A pin that is gone, or names something other than an XDP program, empties
    /// the slots: frames pass (fail open) and are counted. Returns whether anything
    /// changed. Other modes: nothing to follow (the LB's array is used directly).
    pub fn follow(&mut self) -> Result<bool, Error> {
        self.check_lb_pin();
        let target = match &self.spec {
            Some(HandoffSpec::Program(pin)) => Some(pin.clone()),
            _ => None,
        };
        let info = target.as_ref().and_then(|pin| match ProgramInfo::from_pin(pin) {
            Ok(info) => Some(info),
            Err(e) => {
                if self.followed.is_some_and(|(id, _)| id != 0) || self.followed.is_none() {
                    tracing::warn!(pin = %pin.display(), error = %e, "next_program: the pin names no program: frames the limiter passes go to the stack (fail open)");
                }
                None
            }
        });
        let id = info.as_ref().map_or(0, ProgramInfo::id);
        if self.followed.is_some_and(|(old, _)| old == id) {
            return Ok(false);
        }
        // The limiter itself (a build on this pin_dir's maps) would meter every frame
        // again, up to the kernel's 33 tail calls, and drop what the first pass admitted.
        let info = match info {
            Some(i) if crate::attach::tc_filter::program_is_ours(&self.pin_dir, i.id()) => {
                if let Some(pin) = &target {
                    tracing::error!(pin = %pin.display(), id = i.id(), "next_program names the limiter itself: refused, frames pass to the stack (fail open)");
                }
                self.self_reference = Some(i.id());
                None
            }
            info => {
                self.self_reference = None;
                info
            }
        };
        let mut accepted = [false; 2];
        for (i, array) in self.own.iter_mut().enumerate() {
            let Some((_, array)) = array else { continue };
            let set = match &info {
                Some(info) => {
                    let fd = info.fd().map_err(|e| Error::Program {
                        what: "opening the next program".into(),
                        source: Box::new(e),
                    })?;
                    // Refused when the program's type or frags flag differs from this
                    // build's: that build fails open.
                    array.set(0, &fd, 0).is_ok()
                }
                None => false,
            };
            if !set {
                // Not an error when the slot is already empty.
                let _ = array.clear_index(&0);
            }
            accepted[i] = set;
        }
        if let (Some(pin), Some(info)) = (&target, &info) {
            if !accepted.iter().any(|a| *a) {
                tracing::warn!(pin = %pin.display(), id, name = info.name_as_str().unwrap_or("?"), "next_program: the kernel refuses a tail call into this program from the limiter (not an XDP program?): frames pass to the stack (fail open)");
            } else {
                tracing::info!(pin = %pin.display(), id, name = info.name_as_str().unwrap_or("?"), linear = accepted[0], multi_buffer = accepted[1], "next_program: handing frames over to this program");
            }
        }
        self.followed = Some((id, accepted));
        Ok(true)
    }

    /// The build generic mode should run for this handoff: the single-buffer one when
    /// the next program is a plain XDP program (the LB's array, or a pinned program only
    /// the single-buffer build's array took), else the multi-buffer one.
    pub fn generic_build(&self) -> Variant {
        match (&self.spec, self.followed) {
            (Some(HandoffSpec::Slot { .. } | HandoffSpec::Join { .. }), _) => Variant::Linear,
            (Some(HandoffSpec::Program(_)), Some((id, [true, false]))) if id != 0 => {
                Variant::Linear
            }
            _ => Variant::MultiBuffer,
        }
    }

    /// Notices an LB that re-created its array at the pin (an LB restart): the program
    /// keeps the array it was loaded with, whose slots the LB no longer updates. Said
    /// once in the log and by `status` until the daemon restarts and opens the new one.
    fn check_lb_pin(&mut self) {
        let Some((path, data, _)) = &self.lb else {
            return;
        };
        let Ok(ours) = data.info().map(|i| i.id()) else {
            return;
        };
        let now = MapInfo::from_pin(path).ok().map(|i| i.id());
        let replaced = match now {
            Some(id) if id == ours => None,
            Some(id) => Some(format!(
                "the LB re-created its array at {} (map {ours} -> {id}): the limiter still \
                 hands over through the old one; restart the limiter to use the new one",
                path.display()
            )),
            None => Some(format!(
                "the LB's array pin {} is gone (map {ours}): the limiter still hands over \
                 through that array; restart the limiter once the LB is back",
                path.display()
            )),
        };
        if replaced.is_some() && self.lb_replaced.is_none() {
            tracing::error!("{}", replaced.as_deref().unwrap_or_default());
        }
        self.lb_replaced = replaced;
    }

    /// `join_program_array`: writes the limiter's single-buffer build into its slot of
    /// the LB's root array (an atomic slot update: whatever was there is replaced).
    pub fn join(&mut self, linear: &aya::programs::ProgramFd) -> Result<(), Error> {
        let Some(HandoffSpec::Join { array: path, index }) = &self.spec else {
            return Ok(());
        };
        let Some((_, _, array)) = &mut self.lb else {
            return Ok(());
        };
        array.set(*index, linear, 0).map_err(|e| Error::Handoff {
            key: "join_program_array",
            reason: format!(
                "writing the limiter into slot {index} of {}: {e} (the kernel refuses a \
                 program whose type or xdp.frags flag differs from the array's programs)",
                path.display()
            ),
        })?;
        self.joined = Some(*index);
        self.joined_id = self
            .lb
            .as_ref()
            .and_then(|(_, data, _)| slot_program(data, *index).ok().flatten());
        Ok(())
    }

    /// What the joined slot of the LB's root array holds now (`None`: nothing joined).
    /// Another tool may write the slot (Katran's xdpdump writes and clears slot 0 of its
    /// root array): the LB then dispatches past the limiter.
    pub fn joined_slot(&self) -> Option<JoinedSlot> {
        let index = self.joined?;
        let (path, data, _) = self.lb.as_ref()?;
        let at = format!("slot {index} of {}", path.display());
        Some(match slot_program(data, index) {
            Ok(Some(id)) if Some(id) == self.joined_id => JoinedSlot::Limiter,
            Ok(Some(id)) => JoinedSlot::Other {
                at,
                id,
                name: program_name(id).unwrap_or_default(),
            },
            Ok(None) => JoinedSlot::Empty { at },
            Err(e) => JoinedSlot::Unreadable {
                at,
                reason: e.to_string(),
            },
        })
    }

    /// Empties the daemon's own arrays (no handoff configured any more: it should not
    /// keep the LB's program alive).
    pub fn clear_own(&mut self) {
        for (_, array) in self.own.iter_mut().flatten() {
            let _ = array.clear_index(&0);
        }
        self.followed = None;
    }

    /// The status of the handoff as `variant` (the build on an interface, or the one in
    /// the LB's slot) sees it.
    pub fn status(
        &self,
        variant: Variant,
        handoff: Handoff,
        missing_frames: u64,
    ) -> Option<HandoffStatus> {
        let spec = self.spec.as_ref()?;
        let vi = variant_index(variant);
        let (how, array_name, lookup): (&'static str, String, Option<&MapData>) = match spec {
            HandoffSpec::Program(_) => (
                "program pin",
                self.pin_dir
                    .join(if vi == 0 {
                        "HANDOFF_LINEAR"
                    } else {
                        "HANDOFF_MULTI"
                    })
                    .display()
                    .to_string(),
                self.own[vi].as_ref().map(|(d, _)| d),
            ),
            HandoffSpec::Slot { array, .. } | HandoffSpec::Join { array, .. } => (
                if matches!(spec, HandoffSpec::Join { .. }) {
                    "joined LB root array"
                } else {
                    "LB array slot"
                },
                array.display().to_string(),
                if vi == 0 {
                    self.lb.as_ref().map(|(_, d, _)| d)
                } else {
                    None
                },
            ),
        };
        let mut program_id = None;
        let mut missing = None;
        match lookup {
            None => {
                missing = Some(format!(
                    "the {} build runs here: it cannot tail-call into the LB's array of \
                     plain XDP programs (the kernel refuses calls across xdp.frags); frames \
                     pass to the stack",
                    variant.as_str()
                ))
            }
            Some(map) => {
                for i in 0..handoff.slots {
                    match slot_program(map, handoff.first.wrapping_add(i)) {
                        Ok(Some(id)) => {
                            program_id = Some(id);
                            break;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            missing = Some(format!("reading {array_name}: {e}"));
                            break;
                        }
                    }
                }
                if program_id.is_none() && missing.is_none() {
                    missing = Some(match (spec, self.followed) {
                        (HandoffSpec::Program(pin), _) if self.self_reference.is_some() => format!(
                            "the program pinned at {} (id {}) is the limiter itself: refused, \
                             frames pass to the stack",
                            pin.display(),
                            self.self_reference.unwrap_or(0)
                        ),
                        (HandoffSpec::Program(pin), Some((id, accepted)))
                            if id != 0 && !accepted[vi] =>
                        {
                            format!(
                            "the program pinned at {} (id {id}) cannot be tail-called from the \
                             {} build (its type or xdp.frags flag differs): frames pass to \
                             the stack",
                            pin.display(),
                            variant.as_str()
                        )
                        }
                        (HandoffSpec::Program(pin), _) => format!(
                            "no program pinned at {}: frames pass to the stack",
                            pin.display()
                        ),
                        _ if handoff.slots == 0 => {
                            "no slot after the limiter's in the array: frames pass to the stack"
                                .into()
                        }
                        _ => format!(
                            "slot{} {}{} empty: frames pass to the stack",
                            if handoff.slots > 1 { "s" } else { "" },
                            handoff.first,
                            if handoff.slots > 1 {
                                format!("..{}", handoff.first + handoff.slots - 1)
                            } else {
                                String::new()
                            }
                        ),
                    });
                }
            }
        }
        Some(HandoffStatus {
            config: spec.to_string(),
            how,
            array: array_name,
            first_slot: handoff.first,
            slots: handoff.slots,
            program_name: program_id.and_then(program_name),
            program_id,
            missing,
            missing_frames,
            warning: self.lb_replaced.clone(),
            slot_holds_limiter: None,
        })
    }

    /// The slot this daemon wrote the limiter into, if any (left in place at exit:
    /// enforcement survives the daemon; `limiter detach` removes it).
    pub fn joined(&self) -> Option<(&Path, u32)> {
        let index = self.joined?;
        let (path, _, _) = self.lb.as_ref()?;
        Some((path, index))
    }
}

/// What the slot the limiter joined holds ([`HandoffControl::joined_slot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinedSlot {
    /// The program this daemon wrote there.
    Limiter,
    Empty {
        at: String,
    },
    Other {
        at: String,
        id: u32,
        name: String,
    },
    Unreadable {
        at: String,
        reason: String,
    },
}

impl JoinedSlot {
    pub fn holds_limiter(&self) -> bool {
        *self == JoinedSlot::Limiter
    }

    /// What an operator is told when the slot does not hold the limiter.
    pub fn problem(&self) -> Option<String> {
        let fix = "the LB's root array no longer calls the limiter: frames skip it; \
                   `limiter reload` (or a restart) writes it back";
        match self {
            JoinedSlot::Limiter => None,
            JoinedSlot::Empty { at } => Some(format!("{at} is empty: {fix}")),
            JoinedSlot::Other { at, id, name } => Some(format!(
                "{at} holds program {id} ({name}), not the limiter: {fix}"
            )),
            JoinedSlot::Unreadable { at, reason } => Some(format!("reading {at}: {reason}")),
        }
    }
}

/// Removes the limiter from slot `index` of the prog array pinned at `path`, if the
/// program there is the limiter's (`limiter detach`). Another program there is left.
pub fn leave_slot(path: &Path, index: u32) -> Result<bool, Error> {
    let (data, mut array) = open_array(path)?;
    let Some(id) = slot_program(&data, index).map_err(|e| Error::Io {
        what: format!("reading slot {index} of {}", path.display()),
        source: e,
    })?
    else {
        return Ok(false);
    };
    let ours = program_name(id).is_some_and(|n| crate::bpf::pins::is_limiter_program(&n));
    if !ours {
        return Ok(false);
    }
    array.clear_index(&index).map_err(|source| Error::Map {
        what: format!("clearing slot {index} of {}", path.display()),
        source,
    })?;
    Ok(true)
}

/// Prog arrays larger than this are not searched for the limiter's slots at cleanup
/// (one lookup a slot; an LB's root array has a handful).
const MAX_SEARCHED_SLOTS: u32 = 1 << 16;

/// Removes the limiter's programs (builds that use `control_id`, this pin_dir's CONTROL
/// map) from every prog array slot they are in: a `join_program_array` slot outlives the
/// daemon, as links do, and goes with `limiter detach`. Returns what it removed.
pub fn leave_prog_arrays(control_id: u32) -> Result<Vec<String>, Error> {
    let mut removed = Vec::new();
    for info in aya::maps::loaded_maps().filter_map(Result::ok) {
        if !matches!(info.map_type(), Ok(MapType::ProgramArray))
            || info.max_entries() > MAX_SEARCHED_SLOTS
        {
            continue;
        }
        let open = || MapData::from_id(info.id());
        let (Ok(lookup), Ok(data)) = (open(), open()) else {
            continue;
        };
        let Ok(mut array) = prog_array(data, "a prog array") else {
            continue;
        };
        for index in 0..info.max_entries() {
            let Ok(Some(id)) = slot_program(&lookup, index) else {
                continue;
            };
            if !crate::attach::tc_filter::program_uses_map(id, control_id) {
                continue;
            }
            array.clear_index(&index).map_err(|source| Error::Map {
                what: format!(
                    "removing the limiter from slot {index} of prog array {} ({})",
                    info.id(),
                    info.name_as_str().unwrap_or("?")
                ),
                source,
            })?;
            removed.push(format!(
                "slot {index} of prog array {} ({})",
                info.id(),
                info.name_as_str().unwrap_or("?")
            ));
        }
    }
    Ok(removed)
}

/// Whether a reload can switch from `old` to `new` without a restart (pure): the
/// program keeps the arrays it was loaded with, so the LB array must stay the same, and
/// a joined slot stays until a restart (or `limiter detach`).
pub fn live_change(old: Option<&HandoffSpec>, new: Option<&HandoffSpec>) -> bool {
    let join = |s: Option<&HandoffSpec>| matches!(s, Some(HandoffSpec::Join { .. }));
    if old == new {
        return true;
    }
    if join(old) || join(new) {
        return false;
    }
    new.is_none() || old.and_then(HandoffSpec::lb_array) == new.and_then(HandoffSpec::lb_array)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]
    use super::*;

    fn join(index: u32) -> HandoffSpec {
        HandoffSpec::Join {
            array: "/sys/fs/bpf/lb/root".into(),
            index,
        }
    }

    #[test]
    fn plans() {
        assert_eq!(plan(None, None).unwrap(), Handoff::default());
        let pin = HandoffSpec::Program("/sys/fs/bpf/lb/prog".into());
        assert_eq!(
            plan(Some(&pin), None).unwrap(),
            Handoff { first: 0, slots: 1 }
        );
        let slot = HandoffSpec::Slot {
            array: "/sys/fs/bpf/lb/root".into(),
            index: 3,
        };
        assert_eq!(
            plan(Some(&slot), Some(4)).unwrap(),
            Handoff { first: 3, slots: 1 }
        );
        let err = plan(Some(&slot), Some(3)).unwrap_err();
        assert!(
            err.contains("slot 3 is outside the array (it has 3 slots"),
            "{err}"
        );
        // The slots after ours, bounded by the array and by MAX_HANDOFF_SLOTS.
        assert_eq!(
            plan(Some(&join(0)), Some(2)).unwrap(),
            Handoff { first: 1, slots: 1 }
        );
        assert_eq!(
            plan(Some(&join(1)), Some(64)).unwrap(),
            Handoff {
                first: 2,
                slots: MAX_HANDOFF_SLOTS
            }
        );
        // The last slot: nothing after it, frames pass (counted missing).
        assert_eq!(
            plan(Some(&join(3)), Some(4)).unwrap(),
            Handoff { first: 4, slots: 0 }
        );
        assert!(plan(Some(&join(4)), Some(4)).is_err());
    }

    #[test]
    fn live_changes() {
        let pin = |p: &str| HandoffSpec::Program(p.into());
        let slot = |a: &str, index| HandoffSpec::Slot {
            array: a.into(),
            index,
        };
        let live = |a: Option<&HandoffSpec>, b: Option<&HandoffSpec>| live_change(a, b);
        assert!(live(None, Some(&pin("/a"))));
        assert!(live(Some(&pin("/a")), Some(&pin("/b"))));
        assert!(live(Some(&pin("/a")), None));
        assert!(live(Some(&slot("/r", 0)), Some(&slot("/r", 2))));
        assert!(live(Some(&slot("/r", 0)), None));
        assert!(
            !live(Some(&slot("/r", 0)), Some(&slot("/s", 0))),
            "another array"
        );
        assert!(!live(None, Some(&slot("/r", 0))));
        assert!(!live(Some(&pin("/a")), Some(&slot("/r", 0))));
        assert!(!live(Some(&slot("/r", 0)), Some(&pin("/a"))));
        assert!(!live(None, Some(&join(0))));
        assert!(!live(Some(&join(0)), None));
        assert!(!live(Some(&join(0)), Some(&join(1))));
        assert!(live(Some(&join(0)), Some(&join(0))));
    }
}
