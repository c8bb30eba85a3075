//! The CID bitmap (`mm_cidmask`): atomic words in chunks that are allocated as the group grows and never move.
//!
//! Bit `c` set ⇔ some owner (a registration, a core slot or a temporary guard) holds CID `c` (design.md §2.4).
//! Set is `fetch_or` with Acquire, clear is `fetch_and` with Release, so whatever the previous holder of a CID
//! wrote is visible to the next one (I8). The first-zero scan is a racy Relaxed read validated by the `fetch_or`
//! (the kernel's `find_first_zero_bit` and `test_and_set_bit` on `mm_cidmask`, Linux 6.19).
//!
//! **Lanes** (design.md §2.5). The CIDs of a chunk are dealt round-robin over `L` lanes (a power of two, one per
//! core up to 16), each lane on its own 128-byte line: CID `c` lives in lane `c % L`. Lowest-first allocation
//! scans every lane of a row, so it hands out exactly the CIDs a flat bitmap would. Temporaries, taken and dropped
//! at every enter while a core's CID is held by a descheduled thread, come from their core's lane first
//! (`get_near`), so the cores do not bounce one line between them; a CID found there is taken only below the
//! caller's bound (`users + cores`, I2), else the lowest free one anywhere.

use crate::mutants::{Knob, Mutant};
use crate::sync::{spin_loop, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// CIDs per chunk (64 under loom, to keep models small).
#[cfg(not(loom))]
const CHUNK_BITS: usize = 1024;
#[cfg(loom)]
const CHUNK_BITS: usize = 64;
/// Words per lane: a chunk with one lane keeps all its CIDs in one lane.
const LANE_WORDS: usize = CHUNK_BITS / 64;
/// The most lanes a bitmap has: one word per lane per chunk (1 under loom: the models see a flat bitmap).
pub(crate) const MAX_LANES: usize = CHUNK_BITS / 64;
/// Maximum number of chunks: the hard size of the CID space (1 Mi CIDs; 128 under loom).
#[cfg(not(loom))]
const MAX_CHUNKS: usize = 1024;
#[cfg(loom)]
const MAX_CHUNKS: usize = 2;
/// The largest number of CIDs a group can ever hand out.
pub(crate) const MAX_BITS: usize = CHUNK_BITS * MAX_CHUNKS;
/// Debug builds: failed scans in a row after which `get` reports a leak instead of spinning on (about a second
/// per chunk the bitmap has: a scan reads them all; a lost race costs one scan, so only a full bitmap gets here).
/// Smaller in the unit tests, which trip it on purpose.
const WATCHDOG_SCANS: u32 = if cfg!(test) { 1 << 12 } else { 1 << 22 };

/// One lane of a chunk, on its own 128-byte line (two 64-byte lines: adjacent-line prefetch pairs them).
#[repr(align(128))]
struct Lane([AtomicU64; LANE_WORDS]);

struct Chunk {
    /// Lanes `0..L` are used; lane `i` uses words `0..LANE_WORDS / L`.
    lanes: [Lane; MAX_LANES],
}

pub(crate) struct Bitmap {
    /// `chunks[i]` is null until grown; once set it never changes until drop.
    chunks: Box<[AtomicPtr<Chunk>]>,
    /// Number of usable bits (a multiple of `CHUNK_BITS`); only grows.
    bits: AtomicUsize,
    /// `L = 1 << lane_shift` lanes.
    lane_shift: u32,
    /// The group's loom knob: `RelaxedBitmap` makes set and clear Relaxed (model 2 must report the data race).
    pub(crate) knob: Knob,
}

/// Where CID `c` lives: chunk, lane, word in the lane, bit in the word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Place {
    chunk: usize,
    lane: usize,
    word: usize,
    bit: u32,
}

impl Bitmap {
    /// A bitmap with one lane per core, up to `MAX_LANES` (rounded down to a power of two).
    pub(crate) fn new(cores: usize) -> Bitmap {
        let lanes = cores.clamp(1, MAX_LANES);
        Bitmap {
            chunks: (0..MAX_CHUNKS).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
            bits: AtomicUsize::new(0),
            lane_shift: usize::BITS - 1 - lanes.leading_zeros(),
            knob: Knob::default(),
        }
    }

    /// Number of lanes.
    pub(crate) fn lanes(&self) -> usize {
        1 << self.lane_shift
    }

    /// Words each lane uses per chunk.
    fn rows(&self) -> usize {
        LANE_WORDS >> self.lane_shift
    }

    /// The lane of core `cpu` (the mask by `MAX_LANES - 1` changes nothing, `lanes() <= MAX_LANES`, but lets the
    /// compiler drop the bounds check on `Chunk::lanes`).
    #[inline]
    pub(crate) fn lane_of(&self, cpu: usize) -> usize {
        cpu & (self.lanes() - 1) & (MAX_LANES - 1)
    }

    #[inline]
    fn place(&self, cid: usize) -> Place {
        let (chunk, r) = (cid / CHUNK_BITS, cid % CHUNK_BITS);
        let (lane, index) = (self.lane_of(r), r >> self.lane_shift);
        Place { chunk, lane, word: index / 64, bit: (index % 64) as u32 }
    }

    /// The CID at `row`, `bit` of `lane` in chunk `chunk` (the inverse of `place`).
    fn cid_at(&self, chunk: usize, lane: usize, word: usize, bit: u32) -> usize {
        chunk * CHUNK_BITS + ((word * 64 + bit as usize) << self.lane_shift) + lane
    }

    /// Makes at least `bits` bits usable. Called only under the group's lifecycle lock; returns false if `bits`
    /// exceeds the hard size.
    pub(crate) fn grow(&self, bits: usize) -> bool {
        if bits > MAX_BITS {
            return false;
        }
        let mut have = self.bits.load(Ordering::Relaxed); // the caller holds the lifecycle lock: the only writer
        while have < bits {
            let chunk =
                Box::new(Chunk { lanes: std::array::from_fn(|_| Lane(std::array::from_fn(|_| AtomicU64::new(0)))) });
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

    #[inline]
    fn chunk(&self, index: usize) -> Option<&Chunk> {
        let ptr = self.chunks.get(index)?.load(Ordering::Acquire);
        // SAFETY: a non-null chunk pointer came from `Box::into_raw` in `grow`, was published with Release (we
        // loaded it with Acquire, so the chunk's initialisation is visible) and is freed only in `Drop`, which
        // needs `&mut self`; the returned reference borrows `self`.
        unsafe { ptr.as_ref() }
    }

    #[inline]
    fn word(&self, p: Place) -> Option<&AtomicU64> {
        self.chunk(p.chunk).map(|chunk| &chunk.lanes[p.lane].0[p.word])
    }

    fn set_order(&self) -> Ordering {
        if self.knob.is(Mutant::RelaxedBitmap) {
            return Ordering::Relaxed;
        }
        Ordering::Acquire
    }

    fn clear_order(&self) -> Ordering {
        if self.knob.is(Mutant::RelaxedBitmap) {
            return Ordering::Relaxed;
        }
        Ordering::Release
    }

    /// Bits of word `word` of `lane` in chunk `chunk` whose CIDs are below `limit`.
    fn in_range(&self, chunk: usize, lane: usize, word: usize, limit: usize) -> u64 {
        let first = self.cid_at(chunk, lane, word, 0);
        if first >= limit {
            return 0;
        }
        // CIDs first, first + L, ...: those below `limit` are the first ceil((limit - first) / L).
        let n = (limit - first - 1) >> self.lane_shift;
        if n >= 63 {
            u64::MAX
        } else {
            (1u64 << (n + 1)) - 1
        }
    }

    /// Takes bit `bit` of `word`; `None` if another thread set it first.
    fn take(&self, word: &AtomicU64, bit: u32, cid: usize) -> Option<u32> {
        // Acquire: pairs with the Release clear of the previous holder (I8).
        let old = word.fetch_or(1 << bit, self.set_order());
        (old & (1 << bit) == 0).then_some(cid as u32)
    }

    /// One attempt to take the lowest free CID below `limit` (`__mm_get_cid`): `None` if none looked free or the
    /// race for the one found was lost.
    pub(crate) fn try_get(&self, limit: usize) -> Option<u32> {
        let (word, bit, cid) = self.lowest_free(limit)?;
        self.take(word, bit, cid)
    }

    /// Whether a CID below `limit` looks free: a hint, taken before a converger gives up its CID (§2.4).
    pub(crate) fn has_free_below(&self, limit: usize) -> bool {
        self.lowest_free(limit).is_some()
    }

    /// The lowest CID below `limit` that looks free, with its word and bit. Scans row by row; in each row the
    /// lowest free CID is the least of the lanes' lowest free bits.
    #[inline]
    fn lowest_free(&self, limit: usize) -> Option<(&AtomicU64, u32, usize)> {
        let limit = limit.min(self.capacity());
        for c in 0..limit.div_ceil(CHUNK_BITS) {
            let chunk = self.chunk(c)?;
            for w in 0..self.rows() {
                let mut best: Option<(usize, usize, u32)> = None;
                for lane in 0..self.lanes() {
                    let word = &chunk.lanes[lane].0[w];
                    // Relaxed: only a hint; the fetch_or in `take` validates it.
                    let free = !word.load(Ordering::Relaxed) & self.in_range(c, lane, w, limit);
                    if free != 0 {
                        let bit = free.trailing_zeros();
                        let cid = self.cid_at(c, lane, w, bit);
                        if best.map_or(true, |(b, _, _)| cid < b) {
                            best = Some((cid, lane, bit));
                        }
                    }
                }
                if let Some((cid, lane, bit)) = best {
                    return Some((&chunk.lanes[lane].0[w], bit, cid));
                }
            }
        }
        None
    }

    /// Takes the lowest free CID (`mm_get_cid`). The lowest free bit is below `limit` whenever any bit below it is
    /// free, so one scan serves both the kernel's "below max_cids" attempt and its fallback to the whole space.
    /// Lock-free: a retry happens only when other threads' allocations or frees raced with the scan (each race is
    /// another thread's progress). Never fails while the ownership invariant (design.md §2.4) holds, because the
    /// bitmap has at least one more bit than there can be other owners.
    ///
    /// Debug builds have a watchdog (design.md §11): a leak past the bound (a bug: safe code cannot
    /// cause one) would otherwise show only as an `enter` that spins for ever, so after `WATCHDOG_SCANS` failed
    /// scans in a row they panic with what the bitmap holds. Release builds keep spinning: a lost race is
    /// always followed by a free bit.
    pub(crate) fn get(&self) -> u32 {
        let mut failed = 0u32;
        loop {
            if let Some(cid) = self.try_get(usize::MAX) {
                return cid;
            }
            if cfg!(debug_assertions) {
                failed += 1;
                if failed == WATCHDOG_SCANS {
                    self.exhausted();
                }
            }
            spin_loop();
        }
    }

    #[cold]
    #[inline(never)]
    fn exhausted(&self) -> ! {
        panic!(
            "mmcid: no free CID after {WATCHDOG_SCANS} scans ({} of {} marked): a CID leaked past I2's hard \
             bound (design.md §2.4, I5); please report this",
            self.count(),
            self.capacity()
        )
    }

    /// Takes a CID for a temporary on core `cpu`: the lowest free one of the core's lane if it is below `bound`
    /// (the caller's `users + cores`, I2), else the lowest free one anywhere (`get`). Only the core's lane's line
    /// is touched in the common case, where the first word of the lane (CIDs `lane + k·L`, k < 64) has one.
    #[inline]
    pub(crate) fn get_near(&self, cpu: usize, bound: usize) -> u32 {
        let lane = self.lane_of(cpu);
        if let Some(chunk) = self.chunk(0) {
            let word = &chunk.lanes[lane].0[0];
            // A lost race retries in the lane: the bit was taken, so some thread progressed (lock-free, like `get`).
            loop {
                // Relaxed: only a hint; the fetch_or in `take` validates it.
                let free = !word.load(Ordering::Relaxed);
                if free == 0 {
                    return self.get_near_beyond(lane, bound);
                }
                // The lane's lowest free CID; chunk 0 exists, so only `bound` can rule it out (and with it every
                // higher CID of the lane).
                let bit = free.trailing_zeros();
                let cid = self.cid_at(0, lane, 0, bit);
                if cid >= bound {
                    break;
                }
                if let Some(cid) = self.take(word, bit, cid) {
                    return cid;
                }
            }
        }
        self.get()
    }

    /// `get_near` when the first word of the lane is full: the lane's further words below `bound`, then `get`.
    #[cold]
    fn get_near_beyond(&self, lane: usize, bound: usize) -> u32 {
        let limit = bound.min(self.capacity());
        for (c, w) in (0..limit.div_ceil(CHUNK_BITS)).flat_map(|c| (0..self.rows()).map(move |w| (c, w))).skip(1) {
            let Some(chunk) = self.chunk(c) else { break };
            let word = &chunk.lanes[lane].0[w];
            // Relaxed: only a hint; the fetch_or in `take` validates it.
            let free = !word.load(Ordering::Relaxed) & self.in_range(c, lane, w, limit);
            if free != 0 {
                let bit = free.trailing_zeros();
                if let Some(cid) = self.take(word, bit, self.cid_at(c, lane, w, bit)) {
                    return cid;
                }
            }
        }
        self.get()
    }

    /// Takes CID `cid` itself if it has no owner: a pool's reclaim (src/pool.rs) holds an idle CID this way, as a
    /// temporary guard would, while it empties that CID's magazines, then gives it back with [`Bitmap::clear`].
    /// `false` if the bit is set (some owner holds it) or was set first by another thread. `relaxed`: loom's
    /// `RelaxedPoolClaim` mutant (always false in normal builds).
    pub(crate) fn try_claim(&self, cid: u32, relaxed: bool) -> bool {
        let p = self.place(cid as usize);
        let Some(word) = self.word(p) else { return false };
        // Relaxed: a hint that keeps a CID in use from having its line written; the fetch_or decides.
        if word.load(Ordering::Relaxed) & (1 << p.bit) != 0 {
            return false;
        }
        // Acquire: pairs with the Release clear of the CID's previous holder (I8): its magazine writes are visible.
        let order = if relaxed { Ordering::Relaxed } else { self.set_order() };
        word.fetch_or(1 << p.bit, order) & (1 << p.bit) == 0
    }

    /// Returns CID `cid` to the pool.
    pub(crate) fn clear(&self, cid: u32) {
        let p = self.place(cid as usize);
        let word = self.word(p).expect("cleared a CID beyond the bitmap");
        // Release: publishes the holder's writes to the next holder (I8).
        let old = word.fetch_and(!(1 << p.bit), self.clear_order());
        debug_assert!(old & (1 << p.bit) != 0, "CID {cid} released twice");
    }

    /// Number of CIDs marked in use (racy unless quiescent).
    pub(crate) fn count(&self) -> usize {
        (0..self.capacity() / CHUNK_BITS)
            .filter_map(|c| self.chunk(c))
            .flat_map(|chunk| chunk.lanes.iter().flat_map(|lane| lane.0.iter()))
            // Relaxed: a snapshot for stats and audits; callers that need it exact quiesce first (joins order it).
            .map(|w| w.load(Ordering::Relaxed).count_ones() as usize)
            .sum()
    }

    /// Whether `cid` is marked in use.
    pub(crate) fn is_set(&self, cid: u32) -> bool {
        let p = self.place(cid as usize);
        // Relaxed: a snapshot, as in `count`.
        self.word(p).is_some_and(|w| w.load(Ordering::Relaxed) & (1 << p.bit) != 0)
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
        for lanes in [1, 2, 16] {
            let b = Bitmap::new(lanes);
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
    }

    #[test]
    fn grows_across_chunks() {
        for lanes in [1, 4] {
            let b = Bitmap::new(lanes);
            assert!(b.grow(CHUNK_BITS + 1));
            for i in 0..CHUNK_BITS + 5 {
                assert_eq!(b.get(), i as u32);
            }
            assert_eq!(b.count(), CHUNK_BITS + 5);
            assert!(!b.grow(MAX_BITS + 1));
        }
    }

    #[test]
    fn lanes_are_powers_of_two_up_to_the_limit() {
        let lanes = |cores| Bitmap::new(cores).lanes();
        assert_eq!([lanes(0), lanes(1), lanes(2), lanes(3), lanes(6), lanes(16), lanes(200)], [1, 1, 2, 2, 4, 16, 16]);
    }

    #[test]
    fn place_and_cid_at_are_inverse() {
        for lanes in [1, 2, 4, 16] {
            let b = Bitmap::new(lanes);
            let mut seen = std::collections::HashSet::new();
            for cid in 0..3 * CHUNK_BITS {
                let p = b.place(cid);
                assert!(p.lane < b.lanes() && p.word < b.rows(), "{p:?}");
                assert_eq!(b.cid_at(p.chunk, p.lane, p.word, p.bit), cid);
                assert!(seen.insert(p), "two CIDs share {p:?}");
                assert_eq!(p.lane, cid % lanes, "CIDs are dealt round-robin over the lanes");
            }
        }
    }

    /// Lowest-first allocation gives exactly what a flat bitmap gives, whatever the lanes: a reference model of
    /// `Vec<bool>` driven by the same pseudo-random get / try_get(limit) / clear sequence (and convergence's
    /// `has_free_below(limit)` agrees with it before every `try_get`).
    #[test]
    fn lanes_do_not_change_lowest_first_results() {
        for lanes in [1, 2, 4, 16] {
            let b = Bitmap::new(lanes);
            assert!(b.grow(2 * CHUNK_BITS));
            let mut model = vec![false; 2 * CHUNK_BITS];
            let mut held: Vec<u32> = Vec::new();
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..20_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match x % 5 {
                    0 | 1 if held.len() < 2 * CHUNK_BITS => {
                        let want = model.iter().position(|&u| !u).unwrap();
                        let got = b.get();
                        assert_eq!(got as usize, want, "lanes {lanes}: get");
                        model[want] = true;
                        held.push(got);
                    }
                    2 => {
                        let limit = (x >> 8) as usize % (2 * CHUNK_BITS + 10);
                        let want = model.iter().take(limit).position(|&u| !u);
                        assert_eq!(b.has_free_below(limit), want.is_some(), "lanes {lanes}: has_free_below({limit})");
                        let got = b.try_get(limit);
                        assert_eq!(got.map(|c| c as usize), want, "lanes {lanes}: try_get({limit})");
                        if let Some(c) = got {
                            model[c as usize] = true;
                            held.push(c);
                        }
                    }
                    _ if !held.is_empty() => {
                        let c = held.swap_remove((x >> 8) as usize % held.len());
                        b.clear(c);
                        model[c as usize] = false;
                    }
                    _ => {}
                }
                assert_eq!(b.count(), held.len());
            }
            for (c, &used) in model.iter().enumerate() {
                assert_eq!(b.is_set(c as u32), used, "lanes {lanes}: bit {c}");
            }
        }
    }

    #[test]
    fn get_near_stays_in_the_cores_lane_below_the_bound() {
        let b = Bitmap::new(4);
        assert!(b.grow(100));
        assert_eq!(b.get(), 0); // core-owned CIDs, lowest first
        assert_eq!(b.get(), 1);
        // Core 1's temporaries: lane 1 (CIDs 1, 5, 9, ...), skipping 1 (taken).
        assert_eq!(b.get_near(1, 100), 5);
        assert_eq!(b.get_near(5, 100), 9, "core 5 shares lane 1 with core 1");
        assert_eq!(b.get_near(2, 100), 2);
        // Below the bound only: lane 1's next is 13, not below 12, so the lowest free CID anywhere.
        assert_eq!(b.get_near(1, 12), 3);
        b.clear(5);
        assert_eq!(b.get_near(1, 12), 5, "freed CIDs are reused first");
        assert_eq!(b.count(), 6);
    }

    #[test]
    fn get_near_goes_beyond_a_full_first_word() {
        for lanes in [2, 16] {
            let b = Bitmap::new(lanes);
            assert!(b.grow(4 * CHUNK_BITS));
            // Fill lane 0's first word: CIDs 0, L, 2L, ..., 63L.
            for k in 0..64 {
                assert_eq!(b.get_near(0, usize::MAX), (k * lanes) as u32);
            }
            // The lane's next word (chunk 1 when the lane has one word per chunk).
            assert_eq!(b.get_near(0, usize::MAX), (64 * lanes) as u32, "lanes {lanes}");
            // A bound inside the full first word: the lowest free CID anywhere.
            assert_eq!(b.get_near(0, 10), 1, "lanes {lanes}");
            assert_eq!(b.count(), 66);
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "no free CID after 4096 scans (1024 of 1024 marked)")]
    fn a_full_bitmap_trips_the_watchdog() {
        let b = Bitmap::new(2);
        assert!(b.grow(1));
        for c in 0..1024 {
            assert_eq!(b.get(), c);
        }
        b.get();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "released twice")]
    fn double_release_is_caught() {
        let b = Bitmap::new(2);
        b.grow(1);
        let c = b.get();
        b.clear(c);
        b.clear(c);
    }
}
