//! The CID bitmap (`mm_cidmask`): atomic words in chunks that are allocated as the group grows and never move.
//!
//! Bit `c` set ⇔ some owner (a registration, a core slot or a temporary guard) holds CID `c` (design.md §2.4).
//! Set is `fetch_or` with Acquire, clear is `fetch_and` with Release, so whatever the previous holder of a CID
//! wrote is visible to the next one (I8). The first-zero scan is a racy Relaxed read validated by the `fetch_or`
//! (dossier O5).

use crate::sync::{spin_loop, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// Words per chunk: 16 × 64 = 1024 CIDs (one word under loom, to keep models small).
#[cfg(not(loom))]
const CHUNK_WORDS: usize = 16;
#[cfg(loom)]
const CHUNK_WORDS: usize = 1;
const CHUNK_BITS: usize = CHUNK_WORDS * 64;
/// Maximum number of chunks: the hard size of the CID space (1 Mi CIDs; 128 under loom).
#[cfg(not(loom))]
const MAX_CHUNKS: usize = 1024;
#[cfg(loom)]
const MAX_CHUNKS: usize = 2;
/// The largest number of CIDs a group can ever hand out.
pub(crate) const MAX_BITS: usize = CHUNK_BITS * MAX_CHUNKS;

struct Chunk {
    words: [AtomicU64; CHUNK_WORDS],
}

pub(crate) struct Bitmap {
    /// `chunks[i]` is null until grown; once set it never changes until drop.
    chunks: Box<[AtomicPtr<Chunk>]>,
    /// Number of usable bits (a multiple of `CHUNK_BITS`); only grows.
    bits: AtomicUsize,
    /// Loom-only mutant: Relaxed set/clear (model 2 must report the data race).
    #[cfg(loom)]
    pub(crate) relaxed: bool,
}

impl Bitmap {
    pub(crate) fn new() -> Bitmap {
        Bitmap {
            chunks: (0..MAX_CHUNKS).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
            bits: AtomicUsize::new(0),
            #[cfg(loom)]
            relaxed: false,
        }
    }

    /// Makes at least `bits` bits usable. Called only under the group's lifecycle lock; returns false if `bits`
    /// exceeds the hard size.
    pub(crate) fn grow(&self, bits: usize) -> bool {
        if bits > MAX_BITS {
            return false;
        }
        let mut have = self.bits.load(Ordering::Relaxed);
        while have < bits {
            let chunk = Box::new(Chunk { words: std::array::from_fn(|_| AtomicU64::new(0)) });
            // Release: publishes the zeroed chunk; pairs with the Acquire load in `word`.
            self.chunks[have / CHUNK_BITS].store(Box::into_raw(chunk), Ordering::Release);
            have += CHUNK_BITS;
            // Release: a reader that sees the new size also sees the chunk pointer stored above.
            self.bits.store(have, Ordering::Release);
        }
        true
    }

    /// Usable bits.
    pub(crate) fn capacity(&self) -> usize {
        self.bits.load(Ordering::Acquire)
    }

    #[cfg_attr(loom, allow(clippy::modulo_one))] // one word per chunk under loom
    fn word(&self, index: usize) -> Option<&AtomicU64> {
        let ptr = self.chunks.get(index / CHUNK_WORDS)?.load(Ordering::Acquire);
        // SAFETY: a non-null chunk pointer came from `Box::into_raw` in `grow`, was published with Release (we
        // loaded it with Acquire, so the chunk's initialisation is visible) and is freed only in `Drop`, which
        // needs `&mut self`; the returned reference borrows `self`.
        unsafe { ptr.as_ref() }.map(|chunk| &chunk.words[index % CHUNK_WORDS])
    }

    fn set_order(&self) -> Ordering {
        #[cfg(loom)]
        if self.relaxed {
            return Ordering::Relaxed;
        }
        Ordering::Acquire
    }

    fn clear_order(&self) -> Ordering {
        #[cfg(loom)]
        if self.relaxed {
            return Ordering::Relaxed;
        }
        Ordering::Release
    }

    /// One attempt to take the lowest free CID below `limit` (`__mm_get_cid`): `None` if none looked free or the
    /// race for the one found was lost.
    pub(crate) fn try_get(&self, limit: usize) -> Option<u32> {
        let limit = limit.min(self.capacity());
        for index in 0..limit.div_ceil(64) {
            let word = self.word(index)?;
            let in_range = if (index + 1) * 64 <= limit { u64::MAX } else { (1u64 << (limit % 64)) - 1 };
            // Relaxed: only a hint; the fetch_or below validates it.
            let free = !word.load(Ordering::Relaxed) & in_range;
            if free != 0 {
                let bit = free.trailing_zeros() as usize;
                // Acquire: pairs with the Release clear of the previous holder (I8).
                let old = word.fetch_or(1 << bit, self.set_order());
                return (old & (1 << bit) == 0).then_some((index * 64 + bit) as u32);
            }
        }
        None
    }

    /// Takes the lowest free CID (`mm_get_cid`). The lowest free bit is below `limit` whenever any bit below it is
    /// free, so one scan serves both the kernel's "below max_cids" attempt and its fallback to the whole space.
    /// Lock-free: a retry happens only when another thread's allocation won the race. Never fails while the
    /// ownership invariant (design.md §2.4) holds, because the bitmap has at least one more bit than there can be
    /// other owners.
    pub(crate) fn get(&self) -> u32 {
        loop {
            if let Some(cid) = self.try_get(usize::MAX) {
                return cid;
            }
            spin_loop();
        }
    }

    /// Returns CID `cid` to the pool.
    pub(crate) fn clear(&self, cid: u32) {
        let cid = cid as usize;
        let word = self.word(cid / 64).expect("cleared a CID beyond the bitmap");
        // Release: publishes the holder's writes to the next holder (I8).
        let old = word.fetch_and(!(1 << (cid % 64)), self.clear_order());
        debug_assert!(old & (1 << (cid % 64)) != 0, "CID {cid} released twice");
    }

    /// Number of CIDs marked in use (racy unless quiescent).
    pub(crate) fn count(&self) -> usize {
        let words = self.capacity() / 64;
        (0..words).filter_map(|i| self.word(i)).map(|w| w.load(Ordering::Acquire).count_ones() as usize).sum()
    }

    /// Whether `cid` is marked in use.
    pub(crate) fn is_set(&self, cid: u32) -> bool {
        let cid = cid as usize;
        self.word(cid / 64).is_some_and(|w| w.load(Ordering::Acquire) & (1 << (cid % 64)) != 0)
    }
}

impl Drop for Bitmap {
    fn drop(&mut self) {
        for chunk in self.chunks.iter() {
            let ptr = chunk.load(Ordering::Relaxed);
            if !ptr.is_null() {
                // SAFETY: the pointer came from `Box::into_raw` in `grow`, and `&mut self` means no reference
                // from `word` is alive.
                drop(unsafe { Box::from_raw(ptr) });
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn lowest_first_and_limits() {
        let b = Bitmap::new();
        assert_eq!(b.try_get(10), None, "nothing usable before grow");
        assert!(b.grow(5));
        assert_eq!(b.capacity(), CHUNK_BITS);
        assert_eq!(b.get(), 0);
        assert_eq!(b.get(), 1);
        assert_eq!(b.try_get(2), None);
        assert_eq!(b.get(), 2, "the lowest free bit, beyond a limit if none is free below it");
        b.clear(1);
        assert_eq!(b.get(), 1);
        assert_eq!(b.count(), 3);
        assert!(b.is_set(2) && !b.is_set(3));
    }

    #[test]
    fn grows_across_chunks() {
        let b = Bitmap::new();
        assert!(b.grow(CHUNK_BITS + 1));
        for i in 0..CHUNK_BITS + 5 {
            assert_eq!(b.get(), i as u32);
        }
        assert_eq!(b.count(), CHUNK_BITS + 5);
        assert!(!b.grow(MAX_BITS + 1));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "released twice")]
    fn double_release_is_caught() {
        let b = Bitmap::new();
        b.grow(1);
        let c = b.get();
        b.clear(c);
        b.clear(c);
    }
}
