//! The one set of stand-ins for what a platform lacks: without glibc's rseq area (targets other than Linux with
//! glibc on x86_64 or aarch64, builds with `--cfg mmcid_portable`, and loom, which models the sequences in `loom.rs`
//! instead) `cpu_id` is unknown and no group uses sequences; without the critical sections (everywhere but x86_64
//! with the area) every sequence is "not committed". Groups never run one there: `critical_sections()` is false.

/// No rseq area to read: `current_cpu` always asks the platform module (`sys/`).
#[cfg(not(all(
    not(loom),
    not(mmcid_portable),
    target_os = "linux",
    target_env = "gnu",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
// Loom reads only `probe`, `offset`, `area` and `cpu_id_in`.
#[cfg_attr(loom, allow(dead_code))]
mod no_area {
    #[inline(always)]
    pub(crate) fn cpu_id() -> Option<usize> {
        None
    }
    pub(crate) fn probe() {}
    pub(crate) fn offset() -> Option<isize> {
        None
    }
    pub(crate) fn critical_sections() -> bool {
        false
    }
    pub(crate) fn area() -> isize {
        0
    }
    #[inline(always)]
    pub(crate) fn cpu_id_in(_area: isize) -> Option<usize> {
        None
    }
}
#[cfg(not(all(
    not(loom),
    not(mmcid_portable),
    target_os = "linux",
    target_env = "gnu",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
pub(crate) use no_area::*;

/// No critical sections on this target. Not reached: `critical_sections()` is false.
#[cfg(not(all(not(loom), not(mmcid_portable), target_os = "linux", target_env = "gnu", target_arch = "x86_64")))]
#[cfg_attr(loom, allow(dead_code))]
mod no_sequences {
    #[inline(always)]
    pub(crate) fn store_if(
        _area: isize,
        _cpu: u32,
        _mode: &std::sync::atomic::AtomicU32,
        _slot: &std::sync::atomic::AtomicU32,
        _expect: u32,
        _new: u32,
    ) -> bool {
        false
    }
    #[inline(always)]
    pub(crate) fn add_if_owned(
        _: isize,
        _: &std::sync::atomic::AtomicU32,
        _: &std::sync::atomic::AtomicU32,
        _: u32,
        _: &std::sync::atomic::AtomicU64,
        _: u64,
    ) -> bool {
        false
    }
    #[inline(always)]
    pub(crate) fn add_if(
        _: isize,
        _: u32,
        _: &std::sync::atomic::AtomicU32,
        _: &std::sync::atomic::AtomicU32,
        _: u32,
        _: &std::sync::atomic::AtomicU64,
        _: u64,
    ) -> bool {
        false
    }
}
#[cfg(not(all(not(loom), not(mmcid_portable), target_os = "linux", target_env = "gnu", target_arch = "x86_64")))]
#[cfg_attr(loom, allow(unused_imports))] // loom models the sequences in `loom.rs`
pub(crate) use no_sequences::*;
