//! The BPF objects the daemon owns apart from any hook: the program's maps (typed
//! access, installing rules, migrating old layouts), what lives under `pin_dir`, and the
//! RCU grace-period wait.

pub mod grace;
pub mod maps;
pub mod pins;
