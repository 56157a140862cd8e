//! libxdp's multi-program dispatcher, version 2 (xdp-tools' `lib/libxdp/protocol.org`):
//! the configuration the dispatcher program reads from its `.rodata`, and the protocol's
//! constants. The limiter's own dispatcher (limiter-ebpf's `dispatcher` binary) and the
//! daemon that fills its configuration, reads other tools' dispatchers and joins them both
//! use these, so they cannot drift from each other; libxdp is the other side, and the
//! layout here is its `struct xdp_dispatcher_config` byte for byte.

/// `magic`: marks a program as a dispatcher without reading its BTF.
pub const MAGIC: u8 = 236;
/// The protocol version this implements (libxdp 1.2 and later).
pub const VERSION: u8 = 2;
/// What an empty stub returns: bit 31 is in every slot's chain-call actions, so a stub
/// whose component went away lets the frame go on to the next slot.
pub const STUB_RETVAL: u32 = 31;
/// Slots of a dispatcher (`MAX_DISPATCHER_ACTIONS`).
pub const MAX_COMPONENTS: usize = 10;
/// The run priority libxdp gives a program whose BTF names none.
pub const DEFAULT_RUN_PRIO: u32 = 50;
/// `program_flags` bit: the component was loaded with `BPF_F_XDP_HAS_FRAGS`.
pub const PROGRAM_FLAG_FRAGS: u32 = 1 << 5;
/// The name libxdp recognises a dispatcher by (and the program's name in the object).
pub const PROGRAM_NAME: &str = "xdp_dispatcher";
/// The symbol of the configuration in the dispatcher's `.rodata`.
pub const CONFIG_SYMBOL: &str = "conf";
/// The stub function slot `index` of a dispatcher with several slots is attached to (with
/// one, libxdp replaces the dispatcher's main function itself, [`PROGRAM_NAME`]).
pub const STUB_NAMES: [&str; MAX_COMPONENTS] = [
    "prog0", "prog1", "prog2", "prog3", "prog4", "prog5", "prog6", "prog7", "prog8", "prog9",
];

/// `struct xdp_dispatcher_config`: the dispatcher's `.rodata`, frozen at load, so the
/// verifier drops the calls to unused slots.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatcherConfig {
    /// [`MAGIC`].
    pub magic: u8,
    /// [`VERSION`].
    pub dispatcher_version: u8,
    /// Slots in use, from slot 0.
    pub num_progs_enabled: u8,
    /// 1 when the dispatcher was loaded with `BPF_F_XDP_HAS_FRAGS`.
    pub is_xdp_frags: u8,
    /// Per slot, a bitmap of the XDP actions on which the next slot runs
    /// (`1 << XDP_PASS`), always with bit [`STUB_RETVAL`].
    pub chain_call_actions: [u32; MAX_COMPONENTS],
    /// Per slot, the run priority the component was installed with (lower runs first).
    pub run_prios: [u32; MAX_COMPONENTS],
    /// Per slot, [`PROGRAM_FLAG_FRAGS`] or 0.
    pub program_flags: [u32; MAX_COMPONENTS],
}

impl DispatcherConfig {
    /// The value in the object file: no slot in use.
    pub const EMPTY: DispatcherConfig = DispatcherConfig {
        magic: 0,
        dispatcher_version: 0,
        num_progs_enabled: 0,
        is_xdp_frags: 0,
        chain_call_actions: [0; MAX_COMPONENTS],
        run_prios: [0; MAX_COMPONENTS],
        program_flags: [0; MAX_COMPONENTS],
    };
}

/// The chain-call bitmap of a slot whose component continues the chain on `actions`.
pub const fn chain_call_bits(actions: u32) -> u32 {
    actions | (1 << STUB_RETVAL)
}

#[cfg(feature = "user")]
// SAFETY: repr(C), integers only, no padding (asserted below).
unsafe impl aya::Pod for DispatcherConfig {}

const _: () = assert!(core::mem::size_of::<DispatcherConfig>() == 4 + 3 * 4 * MAX_COMPONENTS);
