//! What this host offers, read without changing anything: the kernel's features, this
//! process's capabilities, what the verifier said, the programs loaded, and the compiled
//! objects this binary carries.

pub mod kernel;
pub mod loaded;
pub mod object;
pub mod privilege;
pub mod verifier;
