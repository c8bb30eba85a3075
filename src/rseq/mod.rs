//! Restartable sequences, in one place (design.md §4.1.1, §9.2, §9.3): the kernel's rseq area as glibc registers
//! it, the critical sections that borrow a core's slot or update a `ShardedCounter` shard, their loom twins, and one
//! set of stand-ins where there are none.
//!
//! * `area.rs`: glibc's rseq area (Linux with glibc, x86_64 and aarch64): `probe`, the thread's `cpu_id`, and
//!   `__rseq_offset` (`area`), which groups keep next to their mode word;
//! * `x86_64.rs`: the critical sections (`store_if`, `add_if`, `add_if_owned`: inline asm, each with its `struct
//!   rseq_cs` descriptor and abort handler) and the one-load `cpu_id_in`;
//! * `loom.rs`: the sequences as loom models them (`OnCpu`: one lock per core held across each sequence);
//! * `stubs.rs`: everywhere else (other targets, `--cfg mmcid_portable`, aarch64's missing sequences, loom's
//!   missing area).
//!
//! Who uses them: `sys::current_cpu` reads `cpu_id`; the core-slot protocol borrows with `store_if`
//! (`inner/slots.rs`), the barriers wait for sequences with the RSEQ membarrier (`inner/barriers.rs`), and the
//! counter's whole-update sequences run `add_if` and `add_if_owned` (`registration/sequence.rs`). The examples'
//! kernel `mm_cid` peer keeps its own copy of a sequence: it is an independent peer, not this crate's code.

#[cfg(all(
    not(loom),
    not(mmcid_portable),
    target_os = "linux",
    target_env = "gnu",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod area;
#[cfg(loom)]
mod loom;
#[cfg(not(all(not(loom), not(mmcid_portable), target_os = "linux", target_env = "gnu", target_arch = "x86_64")))]
mod stubs;
#[cfg(all(not(loom), not(mmcid_portable), target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]
mod x86_64;

#[cfg(all(
    not(loom),
    not(mmcid_portable),
    target_os = "linux",
    target_env = "gnu",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub(crate) use area::*;
#[cfg(loom)]
pub(crate) use loom::OnCpu;
#[cfg(not(all(not(loom), not(mmcid_portable), target_os = "linux", target_env = "gnu", target_arch = "x86_64")))]
pub(crate) use stubs::*;
#[cfg(all(not(loom), not(mmcid_portable), target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]
pub(crate) use x86_64::*;
