//! The stand-in load balancer (limiter-ebpf `standin_lb.rs`) and the setup of a tail-call
//! handoff from the limiter to a given program, for the handoff tests and the benchmark.

use std::path::Path;

use anyhow::{bail, Context as _, Result};
use aya::{
    maps::{MapData, PerCpuArray, ProgramArray},
    programs::{ProgramFd, Xdp},
    Ebpf,
};
use limiter_common::abi::Handoff;
use limiter_user::{
    attach::program::Program,
    bpf::maps::Maps,
    host::object::{Variant, STANDIN_LB_OBJECT},
};

/// The LB program: counts in `LB_SEEN[0]`, returns XDP_TX.
pub const LB: &str = "standin_lb";
/// The LB's upgrade: counts in `LB_SEEN[1]`, returns XDP_TX.
pub const LB_V2: &str = "standin_lb_v2";
/// Katran's root in shared mode: tail-calls `ROOT_ARRAY` slots 0..4, else passes (and
/// counts in `LB_SEEN[2]`).
pub const ROOT: &str = "standin_root";
/// The LB's verdict: neither the limiter nor the stack gives it.
pub const XDP_TX: u32 = 3;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;

/// Index of `LB_SEEN` each program counts in.
pub fn seen_slot(program: &str) -> u32 {
    match program {
        LB => 0,
        LB_V2 => 1,
        _ => 2,
    }
}

/// The stand-in LB's programs, loaded (not attached).
pub struct StandinLb {
    ebpf: Ebpf,
}

impl StandinLb {
    pub fn load() -> Result<StandinLb> {
        crate::netns::require_root()?;
        let mut ebpf = Ebpf::load(STANDIN_LB_OBJECT).context("loading the stand-in LB")?;
        for name in [LB, LB_V2, ROOT] {
            let prog: &mut Xdp = ebpf
                .program_mut(name)
                .with_context(|| format!("no program {name} in the stand-in LB"))?
                .try_into()?;
            prog.load().with_context(|| format!("loading {name}"))?;
        }
        Ok(StandinLb { ebpf })
    }

    pub fn program(&self, name: &str) -> Result<&Xdp> {
        Ok(self
            .ebpf
            .program(name)
            .with_context(|| format!("no program {name}"))?
            .try_into()?)
    }

    pub fn program_mut(&mut self, name: &str) -> Result<&mut Xdp> {
        Ok(self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("no program {name}"))?
            .try_into()?)
    }

    pub fn fd(&self, name: &str) -> Result<&ProgramFd> {
        Ok(self.program(name)?.fd()?)
    }

    pub fn id(&self, name: &str) -> Result<u32> {
        Ok(self.program(name)?.info()?.id())
    }

    /// Frames `program` saw (all CPUs).
    pub fn seen(&self, program: &str) -> Result<u64> {
        let map = self.ebpf.map("LB_SEEN").context("no map LB_SEEN")?;
        let seen: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map)?;
        Ok(seen.get(&seen_slot(program), 0)?.iter().sum())
    }

    /// Pins `program` at `path` (`next_program = "PIN"`).
    pub fn pin_program(&mut self, program: &str, path: &Path) -> Result<()> {
        self.program_mut(program)?
            .pin(path)
            .with_context(|| format!("pinning {program} at {}", path.display()))
    }

    /// Pins the root's prog array at `path` (Katran's shared mode).
    pub fn pin_root_array(&mut self, path: &Path) -> Result<()> {
        self.ebpf
            .map_mut("ROOT_ARRAY")
            .context("no map ROOT_ARRAY")?
            .pin(path)
            .with_context(|| format!("pinning ROOT_ARRAY at {}", path.display()))
    }

    /// The root's prog array, to put programs in its slots.
    pub fn root_array(&mut self) -> Result<ProgramArray<&mut MapData>> {
        Ok(ProgramArray::try_from(
            self.ebpf
                .map_mut("ROOT_ARRAY")
                .context("no map ROOT_ARRAY")?,
        )?)
    }
}

/// The limiter's own handoff arrays, one per XDP build. They must live as long as the
/// handoff: the kernel empties a prog array when the last handle on it (descriptor or
/// pin) goes.
pub struct HandoffArrays {
    pub linear: ProgramArray<MapData>,
    pub multi: ProgramArray<MapData>,
}

impl HandoffArrays {
    /// Takes them out of the loaded program (once).
    pub fn take(program: &mut Program) -> Result<HandoffArrays> {
        let [linear, multi] = program.take_handoff_arrays(false);
        let open = |d: Option<MapData>| -> Result<ProgramArray<MapData>> {
            let d = d.context("the handoff arrays were already taken")?;
            Ok(ProgramArray::try_from(aya::maps::Map::ProgramArray(d))?)
        };
        Ok(HandoffArrays {
            linear: open(linear)?,
            multi: open(multi)?,
        })
    }

    pub fn of(&mut self, variant: Variant) -> Result<&mut ProgramArray<MapData>> {
        match variant {
            Variant::Linear => Ok(&mut self.linear),
            Variant::MultiBuffer => Ok(&mut self.multi),
            Variant::Tc => bail!("the TC build never hands over"),
            Variant::Libxdp => bail!("the libxdp component never hands over: the dispatcher does"),
        }
    }
}

/// Hands every frame `variant` of the limiter passes over to `target` (the benchmark's
/// setup): puts it in slot 0 of that build's handoff array and points `HANDOFF` there.
/// Keep the returned arrays as long as the handoff. Fails if the kernel refuses the pair
/// (a program type or `xdp.frags` flag other than the build's).
pub fn hand_over(
    program: &mut Program,
    maps: &mut Maps,
    variant: Variant,
    target: &ProgramFd,
) -> Result<HandoffArrays> {
    let mut arrays = HandoffArrays::take(program)?;
    arrays.of(variant)?.set(0, target, 0).with_context(|| {
        format!(
            "putting the next program in the {} build's handoff array",
            variant.as_str()
        )
    })?;
    maps.set_handoff(Handoff { first: 0, slots: 1 })?;
    Ok(arrays)
}

/// The program id in slot `index` of the prog array pinned at `path` (`None`: empty).
pub fn slot(path: &Path, index: u32) -> Result<Option<u32>> {
    let data = MapData::from_pin(path).with_context(|| format!("opening {}", path.display()))?;
    Ok(limiter_user::attach::handoff::slot_program(&data, index)?)
}
