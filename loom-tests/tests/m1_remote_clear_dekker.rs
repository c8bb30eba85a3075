//! Model 1: the store-buffering (Dekker) pair of the kernel's v2 lazy per-CPU CIDs (v6.4–v6.17), called D1 here:
//! a context switch on a CPU against a remote clear of that CPU's cached CID. A pure litmus copy: mmcid has no
//! remote clear, but the same shape is D-enter / D-exit / D-core in design.md §5.1, which models 3, 4 and 6 check on
//! the real code.
//!
//! * CPU0, the context switch N → Y (Y a task of the mm): `W rq->curr = Y; fence; R slot`. A slot without LAZY
//!   means "keep using CID k" (the slot stays the owner, Y borrows it); with LAZY, CPU0 finishes the lazy put
//!   itself: CAS `k|LAZY → UNSET` and, if it won, clears bit k.
//! * CPU1, the remote clear: CAS `k → k|LAZY`; fence; `R rq->curr`; if curr is not a task of the mm, CAS
//!   `k|LAZY → UNSET` and, if it won, clears bit k.
//!
//! Forbidden outcome (property 1): CPU0 keeps using k while CPU1 clears it. Property 2 (no leak) and "bit cleared
//! exactly once" are checked at the end: the bitmap population equals the number of owners (the slot).
#![cfg(loom)]

use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};
use loom::sync::Arc;
use loom::thread;
use mmcid_loom_tests::model;

const N: u32 = 0; // a task of another mm (or idle)
const Y: u32 = 1; // a task of this mm
const K: u32 = 3; // the CID cached in CPU0's slot
const LAZY: u32 = 1 << 30;
const UNSET: u32 = 1 << 31;

struct Cpu {
    curr: AtomicU32,
    slot: AtomicU32,
    cidmask: AtomicU64,
}

impl Cpu {
    /// The CAS `k|LAZY → UNSET` that either side may win; the winner drops the CID.
    fn put_lazy(&self) {
        if self.slot.compare_exchange(K | LAZY, UNSET, AcqRel, Relaxed).is_ok() {
            let old = self.cidmask.fetch_and(!(1 << K), Release);
            assert!(old & (1 << K) != 0, "CID {K} cleared twice");
        }
    }
}

fn litmus(name: &'static str, switch_fence: bool, remote_fence: bool) {
    model(name, move || {
        let cpu = Arc::new(Cpu { curr: AtomicU32::new(N), slot: AtomicU32::new(K), cidmask: AtomicU64::new(1 << K) });

        let remote = {
            let cpu = cpu.clone();
            thread::spawn(move || {
                if cpu.slot.compare_exchange(K, K | LAZY, Relaxed, Relaxed).is_ok() {
                    if remote_fence {
                        fence(SeqCst); // explicit in C11; implied by the kernel's fully ordered cmpxchg
                    }
                    if cpu.curr.load(Relaxed) != Y {
                        cpu.put_lazy();
                    }
                }
            })
        };

        // CPU0: switch_mm_cid() for next = Y.
        cpu.curr.store(Y, Relaxed);
        if switch_fence {
            fence(SeqCst); // smp_mb__after_switch_mm()
        }
        let s = cpu.slot.load(Relaxed);
        let uses_k = s == K;
        if s == K | LAZY {
            cpu.put_lazy();
        }
        let slot_after_switch = cpu.slot.load(Relaxed);
        if uses_k {
            // Y runs with CID k: nobody may have taken it from the slot.
            assert!(slot_after_switch != UNSET, "remote clear freed the CID of a running task (D1 violated)");
        }

        remote.join().unwrap();
        let owners = usize::from(cpu.slot.load(Relaxed) != UNSET);
        let bits = cpu.cidmask.load(Relaxed).count_ones() as usize;
        assert_eq!(bits, owners, "bitmap population != owners");
        assert!(!uses_k || owners == 1, "remote clear freed the CID of a running task (D1 violated)");
    });
}

#[test]
fn remote_clear_dekker() {
    litmus("remote_clear_dekker", true, true);
}

/// No barrier between the `rq->curr` store and the slot load (the arm64 bug fixed by `smp_mb__after_switch_mm`).
#[test]
#[should_panic(expected = "D1 violated")]
fn remote_clear_dekker_mutant_switch_fence() {
    litmus("remote_clear_dekker_mutant_switch_fence", false, true);
}

/// No barrier between the remote LAZY cmpxchg and its `rq->curr` load (a relaxed cmpxchg in C11).
#[test]
#[should_panic(expected = "D1 violated")]
fn remote_clear_dekker_mutant_remote_fence() {
    litmus("remote_clear_dekker_mutant_remote_fence", true, false);
}
