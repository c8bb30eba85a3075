//! Model 8, litmus: the order of per-task convergence's two steps (design.md §2.4), as a copy with its own atomics.
//! The real code gives its out-of-range CID up before it takes an in-range one (`Registration::enter_task_owned`):
//! model 8 (`m8_membership_vs_enter`) runs it against a registration born meanwhile, and two unit tests stop the
//! real converger between its steps (`per_task_convergence_never_holds_two_cids`,
//! `per_cpu_convergence_never_holds_two_cids`). The former order, take first and give up second, lives only here,
//! as the twin loom rejects: between its two steps the converger holds two CIDs, so a registration born then gets a
//! CID beyond the two that two registrations need (in a group whose cores' shares are in use, at or beyond
//! `users + cores`).
//!
//! The copy: a bitmap word with the library's lowest-first allocation (`Bitmap::get`: a Relaxed scan validated by
//! `fetch_or` Acquire; `try_get`: one attempt below a limit) and release (`fetch_and` Release), and a registration
//! word. CID 1 is the converger's and out of range (`max_cids` is 1 since the other registration left), CID 0 is
//! free. The converger moves to CID 0 while the main thread registers, which takes the lowest free CID.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use loom::sync::Arc;
use loom::thread;
use mmcid_loom_tests::model;

const UNSET: u32 = 1 << 31;
/// `max_cids` after the other registration left.
const MAX: u32 = 1;

/// `Bitmap::get`: the lowest free CID, retried while others race the scan.
fn get(bits: &AtomicU64) -> u32 {
    loop {
        let c = (!bits.load(Relaxed)).trailing_zeros();
        if bits.fetch_or(1 << c, Acquire) & (1 << c) == 0 {
            return c;
        }
    }
}

/// `Bitmap::try_get`: one attempt at the lowest free CID below `limit`.
fn try_get(bits: &AtomicU64, limit: u32) -> Option<u32> {
    let c = (!bits.load(Relaxed)).trailing_zeros();
    (c < limit && bits.fetch_or(1 << c, Acquire) & (1 << c) == 0).then_some(c)
}

fn clear(bits: &AtomicU64, c: u32) {
    bits.fetch_and(!(1 << c), Release);
}

/// The converger's enter, holding out-of-range CID `w` in `word`.
fn converge(bits: &AtomicU64, word: &AtomicU32, take_first: bool) {
    let w = word.load(Relaxed);
    if bits.load(Relaxed) & ((1 << MAX) - 1) == (1 << MAX) - 1 {
        return; // nothing free below max: keep `w`, converge at a later enter
    }
    if take_first {
        // The former order: take the in-range CID, then give `w` up.
        if let Some(n) = try_get(bits, MAX) {
            if word.compare_exchange(w, n, AcqRel, Acquire).is_ok() {
                clear(bits, w);
            }
        }
        return;
    }
    // The real order: give `w` up, then take the lowest free CID and install it.
    if word.compare_exchange(w, UNSET, AcqRel, Acquire).is_ok() {
        clear(bits, w);
    }
    let n = get(bits);
    assert!(word.compare_exchange(UNSET, n, AcqRel, Acquire).is_ok(), "only the owner stores a CID");
}

fn scenario(name: &'static str, take_first: bool) {
    model(name, move || {
        let bits = Arc::new(AtomicU64::new(1 << 1)); // CID 1: the converger's
        let word = Arc::new(AtomicU32::new(1));
        let t1 = {
            let (bits, word) = (bits.clone(), word.clone());
            thread::spawn(move || converge(&bits, &word, take_first))
        };
        // A registration born meanwhile (lifecycle lock held, as `register`): the lowest free CID.
        let born = get(&bits);
        assert!(born < 2, "born with CID {born}: the converger held two CIDs at once");
        t1.join().unwrap();
        let w = word.load(Relaxed);
        assert_ne!(w, born, "one CID, two owners");
        assert_eq!(bits.load(Relaxed), 1 << w | 1 << born, "set bits other than the two owners' (leak)");
    });
}

#[test]
fn convergence_order() {
    scenario("convergence_order", false);
}

/// Convergence in its former order (take the new CID, then give the old one up): between the two steps the
/// converger holds CIDs 0 and 1, and the registration born then gets CID 2.
#[test]
#[should_panic(expected = "born with CID 2")]
fn convergence_order_mutant_takes_first() {
    scenario("convergence_order_mutant_takes_first", true);
}
