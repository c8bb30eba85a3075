//! Model 5: mode word consistency (kernel fix 47ee94efccf6: the ownership and TRANSIT bits in one word, so that no
//! reader sees the new ownership without TRANSIT while the fixup still runs), plus the fence the kernel puts before
//! the store that clears TRANSIT (the completion store, F4 in design.md §5).
//!
//! The writer is a task → CPU switch: it announces the switch (ownership ONCPU plus TRANSIT), runs its fixup (one
//! effect: `fixed = 1`, standing for "the idle tasks' CIDs were taken"), then completes (ONCPU without TRANSIT).
//! The reader is a schedule-in: whenever it sees per-CPU ownership *without* TRANSIT it treats the switch as
//! complete and must therefore see the fixup's effect. mmcid keeps both bits in one word (design.md §2.1), stored
//! with Release and loaded with Acquire, exactly as the passing model does.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU32, Ordering::*};
use loom::sync::Arc;
use loom::thread;
use mmcid_loom_tests::model;

const ONCPU: u32 = 1 << 30;
const TRANSIT: u32 = 1 << 29;

#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    /// mmcid: one word, F1 and F4 Release, reader Acquire.
    OneWord,
    /// One word with a Relaxed completion store (the fence before clearing TRANSIT removed).
    OneWordRelaxedCompletion,
    /// The pre-47ee94efccf6 kernel: two words, plain (Relaxed) accesses, reader loads ownership then transit.
    TwoWordsRelaxed,
    /// Two words with Release stores and Acquire loads, reader loads transit then ownership: ordering cannot
    /// repair a torn read of two words.
    TwoWordsTorn,
}

struct State {
    mode: AtomicU32,
    percpu: AtomicU32,
    transit: AtomicU32,
    fixed: AtomicU32,
}

fn litmus(name: &'static str, enc: Encoding) {
    model(name, move || {
        let s = Arc::new(State {
            mode: AtomicU32::new(0),
            percpu: AtomicU32::new(0),
            transit: AtomicU32::new(0),
            fixed: AtomicU32::new(0),
        });

        let reader = {
            let s = s.clone();
            thread::spawn(move || {
                let (oncpu, transit) = match enc {
                    Encoding::OneWord | Encoding::OneWordRelaxedCompletion => {
                        let m = s.mode.load(Acquire);
                        (m & ONCPU != 0, m & TRANSIT != 0)
                    }
                    Encoding::TwoWordsRelaxed => (s.percpu.load(Relaxed) != 0, s.transit.load(Relaxed) != 0),
                    Encoding::TwoWordsTorn => {
                        let t = s.transit.load(Acquire) != 0;
                        (s.percpu.load(Acquire) != 0, t)
                    }
                };
                if oncpu && !transit {
                    // Steady per-CPU ownership: the fixup must be complete and visible.
                    assert_eq!(
                        s.fixed.load(Relaxed),
                        1,
                        "reader saw per-CPU mode without TRANSIT before the fixup's effects"
                    );
                }
            })
        };

        match enc {
            Encoding::OneWord | Encoding::OneWordRelaxedCompletion => {
                s.mode.store(ONCPU | TRANSIT, Release); // F1
                s.fixed.store(1, Relaxed); // F3
                let order = if enc == Encoding::OneWord { Release } else { Relaxed };
                s.mode.store(ONCPU, order); // F4
            }
            Encoding::TwoWordsRelaxed | Encoding::TwoWordsTorn => {
                let order = if enc == Encoding::TwoWordsTorn { Release } else { Relaxed };
                s.transit.store(1, order);
                s.percpu.store(1, order);
                s.fixed.store(1, Relaxed);
                s.transit.store(0, order);
            }
        }
        reader.join().unwrap();
    });
}

#[test]
fn mode_word() {
    litmus("mode_word", Encoding::OneWord);
}

/// The kernel before 47ee94efccf6: ownership and TRANSIT in two words with plain accesses.
#[test]
#[should_panic(expected = "without TRANSIT before the fixup")]
fn mode_word_mutant_two_words() {
    litmus("mode_word_mutant_two_words", Encoding::TwoWordsRelaxed);
}

/// Two words even with Release / Acquire: the reader can combine an old TRANSIT with a new ownership.
#[test]
#[should_panic(expected = "without TRANSIT before the fixup")]
fn mode_word_mutant_two_words_ordered() {
    litmus("mode_word_mutant_two_words_ordered", Encoding::TwoWordsTorn);
}

/// One word but a Relaxed completion store: the reader sees the final mode without the fixup's effects. In
/// this litmus the reader consumes the effect with a plain load and nothing else publishes it, which is why the
/// kernel needs the fence; in mmcid the same mutant survives (docs/loom.md, "mutants that survive").
#[test]
#[should_panic(expected = "without TRANSIT before the fixup")]
fn mode_word_mutant_release_completion() {
    litmus("mode_word_mutant_release_completion", Encoding::OneWordRelaxedCompletion);
}
