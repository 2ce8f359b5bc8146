//! `mbarrier` objects: 8-byte barriers in shared memory that count arrivals by phase
//! (`cuda::barrier`, `cuda::memcpy_async`, cooperative groups' `memcpy_async` on sm_80 and
//! later).
//!
//! The object's bits: the arrivals still pending in the current phase (bits 0–19), the
//! arrivals each phase expects (bits 20–39) and the current phase's parity (bit 63). An arrive
//! returns a state holding the parity of the phase it arrived in (bit 63) and the arrivals then
//! still pending (bits 0–19); the arrival that makes the pending count reach zero completes the
//! phase: the parity flips and the count starts again from the expected arrivals. A phase has
//! completed once the object's parity differs from the phase's. Lanes arrive one after another,
//! in lane order. A wait that finds its phase incomplete in any lane lets the block's other
//! warps run before the warp goes on (they are the ones that arrive).

use super::*;

/// Bits of each count in an object.
const COUNT_BITS: u32 = 20;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// Where the expected arrivals start.
const EXPECTED_SHIFT: u32 = COUNT_BITS;
/// The phase parity's bit.
const PHASE_BIT: u64 = 1 << 63;
/// Bytes of an object.
const OBJECT_BYTES: usize = 8;

/// An object expecting `count` arrivals per phase, in phase 0.
fn initial(count: u64) -> u64 {
    let c = count & COUNT_MASK;
    c | (c << EXPECTED_SHIFT)
}

/// The object after `count` arrivals (`drop`: and as many fewer expected from the next phase
/// on), and the state the arrive returns.
fn arrive(obj: u64, count: u64, drop: bool) -> (u64, u64) {
    let phase = obj & PHASE_BIT;
    let pending = obj & COUNT_MASK;
    let mut expected = (obj >> EXPECTED_SHIFT) & COUNT_MASK;
    if drop {
        expected = expected.saturating_sub(count);
    }
    let (phase, pending) = if pending <= count {
        (phase ^ PHASE_BIT, expected)
    } else {
        (phase, pending - count)
    };
    let state = (obj & PHASE_BIT) | (pending & COUNT_MASK);
    (phase | (expected << EXPECTED_SHIFT) | pending, state)
}

impl<'a> Worker<'a> {
    /// An `mbarrier` instruction for the lanes in `m`: writes `op.d` and returns the lanes
    /// whose wait found its phase complete (`test_wait`, `try_wait`; all of `m` otherwise).
    /// Out of line, so that it costs the other instructions' dispatch nothing.
    #[inline(never)]
    pub(super) fn mbarrier(
        &mut self,
        w: WarpRef<'_>,
        regs: &mut [[u64; 32]],
        m: u32,
        op: &Mbarrier,
        line: u32,
    ) -> Result<u32, Fault> {
        let mut done = 0u32;
        for lane in (0..32u32).filter(|l| m >> l & 1 != 0) {
            let l = lane as usize;
            if op.kind == MbarKind::PendingCount {
                regs[op.d as usize][l] = regs[op.a as usize][l] & COUNT_MASK;
                continue;
            }
            let addr = regs[op.base as usize][l].wrapping_add(op.off as u64);
            let what = "mbarrier";
            let fault = |this: &Self, e| this.mem_fault(w, lane, line, what, addr, OBJECT_BYTES, e);
            let store = |this: &mut Self, v| {
                this.store_any(w, lane, op.space, addr, OBJECT_BYTES, v, Ordering::SeqCst)
                    .map_err(|e| fault(this, e))
            };
            match op.kind {
                MbarKind::Init => store(self, initial(regs[op.a as usize][l]))?,
                MbarKind::Inval => store(self, 0)?,
                MbarKind::Arrive { drop } => {
                    let obj = self
                        .load_any(w, lane, op.space, addr, OBJECT_BYTES, Ordering::SeqCst)
                        .map_err(|e| fault(self, e))?;
                    let count = if op.a == NONE {
                        1
                    } else {
                        regs[op.a as usize][l] & COUNT_MASK
                    };
                    let (next, state) = arrive(obj, count, drop);
                    store(self, next)?;
                    regs[op.d as usize][l] = state;
                }
                MbarKind::TestWait { parity } => {
                    let obj = self
                        .load_any(w, lane, op.space, addr, OBJECT_BYTES, Ordering::SeqCst)
                        .map_err(|e| fault(self, e))?;
                    let a = regs[op.a as usize][l];
                    let waited = if parity {
                        a & 1 != 0
                    } else {
                        a & PHASE_BIT != 0
                    };
                    if (obj & PHASE_BIT != 0) != waited {
                        done |= 1 << lane;
                    }
                    continue;
                }
                MbarKind::PendingCount => {}
            }
            done |= 1 << lane;
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_arrival_completes_the_phase_and_starts_the_next() {
        let mut obj = initial(3);
        let mut states = Vec::new();
        for _ in 0..3 {
            let (next, state) = arrive(obj, 1, false);
            obj = next;
            states.push(state);
        }
        assert_eq!(
            states.iter().map(|s| s & COUNT_MASK).collect::<Vec<_>>(),
            [2, 1, 3]
        );
        assert!(
            states.iter().all(|s| s & PHASE_BIT == 0),
            "all arrived in phase 0"
        );
        assert_eq!(obj & PHASE_BIT, PHASE_BIT, "phase 1 now");
        assert_eq!(obj & COUNT_MASK, 3);
        // Two at once, then a drop: the next phase expects one fewer.
        let (obj, _) = arrive(obj, 2, false);
        let (obj, s) = arrive(obj, 1, true);
        assert_eq!(s & PHASE_BIT, PHASE_BIT);
        assert_eq!(obj & PHASE_BIT, 0);
        assert_eq!(obj & COUNT_MASK, 2);
    }

    #[test]
    fn arrivals_on_an_object_never_initialised_do_not_underflow() {
        let (obj, _) = arrive(0, 5, true);
        assert_eq!(obj & COUNT_MASK, 0);
        assert_eq!(obj & PHASE_BIT, PHASE_BIT);
    }
}
