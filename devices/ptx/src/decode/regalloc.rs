//! Register allocation: a decoded function's virtual registers packed into as few frame
//! registers as their live ranges allow.
//!
//! NVVM writes PTX in SSA style: every value gets a register of its own, so a large unrolled
//! kernel (CUB's merge sort declares 25 659) would make every warp hold tens of megabytes of
//! registers, and a block of 256 threads pass the interpreter's register-file limit. ptxas
//! maps such code onto a few hundred physical registers; this pass does the same for the
//! interpreter's frames.
//!
//! Liveness is the classic backward data flow over basic blocks; a register's interval is the
//! span of linear positions (first to last) where it is defined, used or live, and a linear
//! scan gives registers whose intervals do not overlap (not even at one instruction, so an
//! instruction never writes a register one of its sources still occupies) the same frame
//! register. Two facts of SIMT execution keep this sound:
//! - every instruction writes only the lanes active in it, so the lanes a divergent path leaves
//!   parked keep their values however the register is shared on the path that runs;
//! - a guarded instruction may leave some lanes' old values in place, so its destinations count
//!   as read as well as written (they are live before it).
//!
//! Registers the frame initialises (immediates, symbol addresses) and the sink that unused
//! results go to keep registers of their own. A function too large for the analysis' bounds
//! (its sets' size, its passes) keeps its registers as declared.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::Func;
use crate::cfg;
use crate::error::LoadError;
use crate::ir::*;
use crate::watch::Ticker;

/// Most 64-bit words the liveness sets of one function may take (blocks × registers / 64);
/// past it the function keeps its registers as declared.
const MAX_LIVENESS_WORDS: usize = 1 << 22;
/// Most passes over the blocks before liveness must have settled: compilers' control flow
/// settles in a few (loop nesting depth plus two); a function that has not keeps its registers
/// as declared.
const MAX_LIVENESS_PASSES: usize = 64;

/// How an instruction touches a register.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Use,
    Def,
}

/// Calls `f` on every register operand of `op` (never `NONE`).
pub(crate) fn visit_regs(op: &mut Op, f: &mut impl FnMut(&mut Reg, Access)) {
    use Access::{Def, Use};
    let mut one = |r: &mut Reg, a: Access| {
        if *r != NONE {
            f(r, a);
        }
    };
    match op {
        Op::CvtFp8 { d, a, b, .. } => {
            one(a, Use);
            one(b, Use);
            one(d, Def);
        }
        Op::CallIndirect(c) => one(&mut c.target, Use),
        Op::Mbarrier(b) => {
            one(&mut b.base, Use);
            one(&mut b.a, Use);
            one(&mut b.d, Def);
        }
        Op::Nop
        | Op::Yield
        | Op::Setp { .. }
        | Op::PLogic { .. }
        | Op::PNot { .. }
        | Op::PMov { .. }
        | Op::Bra { .. }
        | Op::Call(_)
        | Op::CallBuiltin(_)
        | Op::Ret
        | Op::Exit
        | Op::Trap
        | Op::Fence => {
            if let Op::Setp { a, b, .. } = op {
                one(a, Use);
                one(b, Use);
            }
        }
        Op::Mov { d, a }
        | Op::Cvta { d, a, .. }
        | Op::Cvt { d, a, .. }
        | Op::IUn { d, a, .. }
        | Op::FUn { d, a, .. }
        | Op::MovMatrix { d, a }
        | Op::CvtTf32 { d, a } => {
            one(a, Use);
            one(d, Def);
        }
        Op::Special { d, .. } | Op::Activemask { d } => one(d, Def),
        Op::Pack { d, parts, .. } => {
            parts.iter_mut().for_each(|p| one(p, Use));
            one(d, Def);
        }
        Op::Unpack { a, parts, .. } => {
            one(a, Use);
            parts.iter_mut().for_each(|p| one(p, Def));
        }
        Op::Ld { d, base, .. } => {
            one(base, Use);
            d.iter_mut().for_each(|r| one(r, Def));
        }
        Op::St { s, base, .. } => {
            one(base, Use);
            s.iter_mut().for_each(|r| one(r, Use));
        }
        Op::LdKParam { d, .. } | Op::LdFParam { d, .. } => {
            d.iter_mut().for_each(|r| one(r, Def));
        }
        Op::StFParam { s, .. } => s.iter_mut().for_each(|r| one(r, Use)),
        Op::Isspacep { a, .. } | Op::Testp { a, .. } => one(a, Use),
        Op::CvtPack { d, a, b, .. }
        | Op::IBin { d, a, b, .. }
        | Op::FBin { d, a, b, .. }
        | Op::Set { d, a, b, .. }
        | Op::Selp { d, a, b, .. } => {
            one(a, Use);
            one(b, Use);
            one(d, Def);
        }
        Op::ITern { d, a, b, c, .. }
        | Op::Prmt { d, a, b, c, .. }
        | Op::Lop3 { d, a, b, c, .. }
        | Op::Shf { d, a, b, c, .. }
        | Op::Fma { d, a, b, c, .. }
        | Op::Slct { d, a, b, c, .. } => {
            one(a, Use);
            one(b, Use);
            one(c, Use);
            one(d, Def);
        }
        Op::Bfi { d, a, b, c, e, .. } => {
            for s in [a, b, c, e] {
                one(s, Use);
            }
            one(d, Def);
        }
        Op::Bar {
            k, id, count, d, ..
        } => {
            one(id, Use);
            one(count, Use);
            // bar.red.popc's result is a register; .and/.or's a predicate.
            if *k == BarKind::RedPopc {
                one(d, Def);
            }
        }
        Op::Atom { d, base, b, c, .. } => {
            one(base, Use);
            one(b, Use);
            one(c, Use);
            one(d, Def);
        }
        Op::Shfl {
            d, a, b, c, mask, ..
        } => {
            for s in [a, b, c, mask] {
                one(s, Use);
            }
            one(d, Def);
        }
        Op::Vote { mode, d, mask, .. } => {
            one(mask, Use);
            // vote.ballot's result is a register; the others' a predicate.
            if *mode == VoteMode::Ballot {
                one(d, Def);
            }
        }
        Op::Redux { d, a, mask, .. } | Op::Match { d, a, mask, .. } => {
            one(a, Use);
            one(mask, Use);
            one(d, Def);
        }
        Op::Elect { d, mask, .. } => {
            one(mask, Use);
            one(d, Def);
        }
        Op::CpAsync {
            dbase,
            sbase,
            src_size,
            ..
        } => {
            for s in [dbase, sbase, src_size] {
                one(s, Use);
            }
        }
        Op::Fns {
            d, mask, base, off, ..
        } => {
            for s in [mask, base, off] {
                one(s, Use);
            }
            one(d, Def);
        }
        Op::Tex(t) => {
            one(&mut t.handle, Use);
            t.c.iter_mut().for_each(|r| one(r, Use));
            one(&mut t.layer, Use);
            match &mut t.lod {
                TexLod::Base => {}
                TexLod::Level(r) => one(r, Use),
                TexLod::Grad(x, y) => x.iter_mut().chain(y.iter_mut()).for_each(|r| one(r, Use)),
            }
            t.d.iter_mut().for_each(|r| one(r, Def));
        }
        Op::WmmaLoad(w) => {
            one(&mut w.base, Use);
            one(&mut w.stride, Use);
            w.regs.iter_mut().for_each(|r| one(r, Def));
        }
        Op::WmmaStore(w) => {
            one(&mut w.base, Use);
            one(&mut w.stride, Use);
            w.regs.iter_mut().for_each(|r| one(r, Use));
        }
        Op::WmmaMma(w) | Op::MmaSync(w) => {
            for r in w
                .regs_a
                .iter_mut()
                .chain(&mut w.regs_b)
                .chain(&mut w.regs_c)
            {
                one(r, Use);
            }
            w.regs_d.iter_mut().for_each(|r| one(r, Def));
        }
        Op::LdMatrix(m) => {
            one(&mut m.base, Use);
            m.regs.iter_mut().for_each(|r| one(r, Def));
        }
        Op::StMatrix(m) => {
            one(&mut m.base, Use);
            m.regs.iter_mut().for_each(|r| one(r, Use));
        }
        Op::Suld(s) => {
            one(&mut s.handle, Use);
            s.c.iter_mut().for_each(|r| one(r, Use));
            one(&mut s.layer, Use);
            s.v.iter_mut().for_each(|r| one(r, Def));
        }
        Op::Sust(s) => {
            one(&mut s.handle, Use);
            s.c.iter_mut().for_each(|r| one(r, Use));
            one(&mut s.layer, Use);
            s.v.iter_mut().for_each(|r| one(r, Use));
        }
        Op::Txq { d, handle, .. } => {
            one(handle, Use);
            one(d, Def);
        }
    }
}

/// The registers instruction `ins` reads and writes, of those below `n` not `pinned`; a
/// guarded instruction's destinations are read too.
fn accesses(ins: &mut Inst, n: usize, pinned: &[bool], uses: &mut Vec<Reg>, defs: &mut Vec<Reg>) {
    uses.clear();
    defs.clear();
    let guarded = ins.guard != NONE;
    visit_regs(&mut ins.op, &mut |r, a| {
        let i = *r as usize;
        if i >= n || pinned[i] {
            return;
        }
        if a == Access::Use || guarded {
            uses.push(*r);
        }
        if a == Access::Def {
            defs.push(*r);
        }
    });
}

/// Fixed-size bit sets, `words` 64-bit words each, in one vector.
struct Sets {
    words: usize,
    bits: Vec<u64>,
}

impl Sets {
    fn set(&self, i: usize) -> &[u64] {
        &self.bits[i * self.words..(i + 1) * self.words]
    }
}

/// Packs `func`'s registers (see the module documentation), asking `ticker` whether to go on.
pub(crate) fn compact(func: &mut Func, ticker: &mut Ticker<'_>) -> Result<(), LoadError> {
    let n = func.nregs as usize;
    let len = func.code.len();
    if n == 0 || len == 0 {
        return Ok(());
    }
    let mut pinned = vec![false; n];
    pinned[func.sink as usize] = true;
    for &(r, _) in &func.init_regs {
        pinned[r as usize] = true;
    }
    let cfg::Blocks { starts, succ, .. } = cfg::basic_blocks(&func.code);
    let nb = starts.len();
    let words = n.div_ceil(64);
    if nb.saturating_mul(words) > MAX_LIVENESS_WORDS {
        return Ok(());
    }
    let end_of = |b: usize| starts.get(b + 1).copied().unwrap_or(len);

    // Per block: registers read before any write in it (gen) and written unguarded (kill).
    let (mut uses, mut defs) = (Vec::new(), Vec::new());
    let mut gen_kill: Vec<(Vec<Reg>, Vec<Reg>)> = Vec::with_capacity(nb);
    let mut seen = vec![false; n];
    for (b, &s) in starts.iter().enumerate() {
        let (mut g, mut k) = (Vec::new(), Vec::new());
        for ins in &mut func.code[s..end_of(b)] {
            accesses(ins, n, &pinned, &mut uses, &mut defs);
            for &u in &uses {
                if !seen[u as usize] {
                    g.push(u);
                }
            }
            if ins.guard == NONE {
                for &d in &defs {
                    if !seen[d as usize] {
                        seen[d as usize] = true;
                        k.push(d);
                    }
                }
            }
        }
        for &d in &k {
            seen[d as usize] = false;
        }
        gen_kill.push((g, k));
    }
    ticker.tick(len as u64, func.line)?;

    // Live-in sets to a fixed point, blocks in reverse order.
    let mut live_in = Sets {
        words,
        bits: vec![0; nb * words],
    };
    let mut out = vec![0u64; words];
    let live_out = |live_in: &Sets, b: usize, out: &mut [u64]| {
        out.iter_mut().for_each(|w| *w = 0);
        // The function's exit (`nb`) has nothing live.
        for &s in succ[b].iter().filter(|&&s| s < nb) {
            for (o, i) in out.iter_mut().zip(live_in.set(s)) {
                *o |= i;
            }
        }
    };
    for pass in 0.. {
        if pass == MAX_LIVENESS_PASSES {
            return Ok(());
        }
        let mut changed = false;
        for b in (0..nb).rev() {
            live_out(&live_in, b, &mut out);
            let (g, k) = &gen_kill[b];
            for &r in k {
                out[r as usize / 64] &= !(1 << (r % 64));
            }
            for &r in g {
                out[r as usize / 64] |= 1 << (r % 64);
            }
            let cur = &mut live_in.bits[b * words..(b + 1) * words];
            if cur != out.as_slice() {
                cur.copy_from_slice(&out);
                changed = true;
            }
        }
        ticker.tick((nb * words) as u64, func.line)?;
        if !changed {
            break;
        }
    }

    // Intervals: the first and last linear positions where each register is touched or live.
    let mut first = vec![usize::MAX; n];
    let mut last = vec![0usize; n];
    let mut touch = |r: usize, at: usize| {
        first[r] = first[r].min(at);
        last[r] = last[r].max(at);
    };
    for (b, &s) in starts.iter().enumerate() {
        let e = end_of(b);
        live_out(&live_in, b, &mut out);
        for (wi, &w) in out.iter().enumerate() {
            let mut w = w;
            while w != 0 {
                touch(wi * 64 + w.trailing_zeros() as usize, e - 1);
                w &= w - 1;
            }
        }
        for (wi, &w) in live_in.set(b).iter().enumerate() {
            let mut w = w;
            while w != 0 {
                touch(wi * 64 + w.trailing_zeros() as usize, s);
                w &= w - 1;
            }
        }
        for (at, ins) in func.code[s..e].iter_mut().enumerate() {
            accesses(ins, n, &pinned, &mut uses, &mut defs);
            for &r in uses.iter().chain(&defs) {
                touch(r as usize, s + at);
            }
        }
    }

    // Linear scan: pinned registers first, in order, then one register per colour.
    let mut map = vec![NONE; n];
    let mut next = 0u32;
    for (r, _) in pinned.iter().enumerate().filter(|(_, p)| **p) {
        map[r] = next;
        next += 1;
    }
    let base = next;
    let mut order: Vec<usize> = (0..n)
        .filter(|&r| !pinned[r] && first[r] != usize::MAX)
        .collect();
    order.sort_unstable_by_key(|&r| (first[r], r));
    let mut active: BinaryHeap<Reverse<(usize, u32)>> = BinaryHeap::new();
    let mut free: BinaryHeap<Reverse<u32>> = BinaryHeap::new();
    let mut colours = 0u32;
    for r in order {
        while let Some(&Reverse((end, c))) = active.peek() {
            if end >= first[r] {
                break;
            }
            active.pop();
            free.push(Reverse(c));
        }
        let c = free.pop().map_or_else(
            || {
                colours += 1;
                colours - 1
            },
            |Reverse(c)| c,
        );
        map[r] = base + c;
        active.push(Reverse((last[r], c)));
    }
    let total = base + colours;
    if total >= func.nregs {
        return Ok(());
    }
    for ins in &mut func.code {
        visit_regs(&mut ins.op, &mut |r, _| {
            // Registers no instruction touches keep no frame register: nothing reads them.
            if let Some(&m) = map.get(*r as usize)
                && m != NONE
            {
                *r = m;
            }
        });
    }
    for (r, _) in &mut func.init_regs {
        *r = map[*r as usize];
    }
    func.sink = map[func.sink as usize];
    func.nregs = total;
    Ok(())
}
