//! Loaded BPF programs, found by id.

use aya::programs::ProgramInfo;

/// The loaded program with kernel id `id`: `None` when it is gone, and for every id
/// when this process may not list programs (BPF_PROG_GET_NEXT_ID needs CAP_SYS_ADMIN).
pub fn program_info(id: u32) -> Option<ProgramInfo> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
}
