//! The compiled eBPF objects this binary carries, and the builds of the program in them.
//!
//! build.rs compiles limiter-ebpf into `limiter.bpf.o` (the limiter's builds, one per
//! [`Variant`], sharing every map), `baseline.bpf.o` and `standin_lb.bpf.o` (reference
//! programs for the benchmarks and the handoff tests).

use aya::include_bytes_aligned;
use limiter_common::abi::{
    PROGRAM_NAME, PROGRAM_NAME_LIBXDP, PROGRAM_NAME_LINEAR, PROGRAM_NAME_TC,
};

/// The XDP object, built by build.rs.
pub static OBJECT: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter.bpf.o"));
/// Reference programs `baseline_pass` and `baseline_drop` (benchmarks compare against
/// them).
pub static BASELINE_OBJECT: &[u8] =
    include_bytes_aligned!(concat!(env!("OUT_DIR"), "/baseline.bpf.o"));
/// A stand-in load balancer (`standin_lb`, `standin_lb_v2`, `standin_root`) for tests and
/// benchmarks of the tail-call handoff.
pub static STANDIN_LB_OBJECT: &[u8] =
    include_bytes_aligned!(concat!(env!("OUT_DIR"), "/standin_lb.bpf.o"));

/// Which build of the program runs on an interface. Both share every map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Loaded without `frags`: the kernel only hands it single-buffer frames, so it reads
    /// the frame length without a helper call. Preferred in native mode.
    Linear,
    /// `xdp.frags`: for interfaces whose MTU needs several buffers per frame (the kernel
    /// refuses the linear build there), and for generic mode, where the linear build
    /// would make the kernel linearize every multi-buffer skb.
    MultiBuffer,
    /// A classifier at TC ingress (`xdp_mode = "tc"`).
    Tc,
    /// The single-buffer build without the handoff, as an freplace component of a libxdp
    /// dispatcher (`xdp_share = "libxdp"`; loaded only then, so not in [`Variant::ALL`]).
    Libxdp,
}

impl Variant {
    pub const ALL: [Variant; 3] = [Variant::Linear, Variant::MultiBuffer, Variant::Tc];
    /// The XDP builds.
    pub const XDP: [Variant; 2] = [Variant::Linear, Variant::MultiBuffer];

    /// The program's name in the object.
    pub fn program_name(self) -> &'static str {
        match self {
            Variant::Linear => PROGRAM_NAME_LINEAR,
            Variant::MultiBuffer => PROGRAM_NAME,
            Variant::Tc => PROGRAM_NAME_TC,
            Variant::Libxdp => PROGRAM_NAME_LIBXDP,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Linear => "linear",
            Variant::MultiBuffer => "multi-buffer",
            Variant::Tc => "tc",
            Variant::Libxdp => "libxdp component",
        }
    }
}

/// An object file's bytes at 8-byte alignment.
pub struct AlignedObject {
    words: Vec<u64>,
    len: usize,
}

impl AlignedObject {
    /// A copy of `bytes` at 8-byte alignment.
    pub fn from_bytes(bytes: &[u8]) -> AlignedObject {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(b);
        }
        AlignedObject {
            words,
            len: bytes.len(),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes, and u8 has no alignment
        // or validity requirement.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}
