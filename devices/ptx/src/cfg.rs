//! Control-flow analysis: immediate post-dominators give every conditional branch its
//! reconvergence point (the classic SIMT-stack / IPDOM scheme).

use crate::error::LoadError;
use crate::ir::{Inst, NONE, Op};
use crate::watch::Ticker;

/// The basic blocks of a function's code.
pub(crate) struct Blocks {
    /// Each block's first instruction, in order.
    pub starts: Vec<usize>,
    /// The block of each instruction.
    pub block_of: Vec<usize>,
    /// Each block's successors; `starts.len()` stands for the function's exit.
    pub succ: Vec<Vec<usize>>,
}

/// The basic blocks of `code` (not empty): a block ends at a branch, `ret`, `exit` or `trap`,
/// or before a branch target; a guarded one also falls through.
pub(crate) fn basic_blocks(code: &[Inst]) -> Blocks {
    let n = code.len();
    let mut leader = vec![false; n + 1];
    leader[0] = true;
    for (i, ins) in code.iter().enumerate() {
        match &ins.op {
            Op::Bra { target, .. } => {
                if (*target as usize) < n {
                    leader[*target as usize] = true;
                }
                leader[i + 1] = true;
            }
            Op::Ret | Op::Exit | Op::Trap => leader[i + 1] = true,
            _ => {}
        }
    }
    let mut block_of = vec![0usize; n];
    let mut starts = Vec::new();
    for i in 0..n {
        if leader[i] {
            starts.push(i);
        }
        block_of[i] = starts.len() - 1;
    }
    let nb = starts.len();
    let exit = nb;
    let succ = (0..nb)
        .map(|b| {
            let end = starts.get(b + 1).copied().unwrap_or(n) - 1;
            let ins = &code[end];
            let guarded = ins.guard != NONE;
            let next = if end + 1 < n { block_of[end + 1] } else { exit };
            let mut s = Vec::new();
            match &ins.op {
                Op::Bra { target, .. } => {
                    s.push(if (*target as usize) < n {
                        block_of[*target as usize]
                    } else {
                        exit
                    });
                    if guarded {
                        s.push(next);
                    }
                }
                Op::Ret | Op::Exit | Op::Trap => {
                    s.push(exit);
                    if guarded {
                        s.push(next);
                    }
                }
                _ => s.push(next),
            }
            s
        })
        .collect();
    Blocks {
        starts,
        block_of,
        succ,
    }
}

/// Sets `rpc` of every `bra` to the first instruction of its block's immediate post-dominator
/// (`NONE` when the paths only meet at function exit).
#[cfg(test)]
pub(crate) fn assign_reconvergence(code: &mut [Inst]) {
    let _ = assign_reconvergence_watched(code, &mut Ticker::none(), 0);
}

/// [`assign_reconvergence`] of the function at PTX line `line`, asking `ticker` whether to go
/// on as it goes (hostile control flow can make the fixed point slow).
pub(crate) fn assign_reconvergence_watched(
    code: &mut [Inst],
    ticker: &mut Ticker<'_>,
    line: usize,
) -> Result<(), LoadError> {
    let n = code.len();
    if n == 0 {
        return Ok(());
    }
    ticker.tick(n as u64, line)?;
    let Blocks {
        starts,
        block_of,
        mut succ,
    } = basic_blocks(code);
    let nb = starts.len();
    let exit = nb;
    // The exit node has no successors.
    succ.push(Vec::new());
    // Post-order of the reverse graph from the exit node (iterative DFS over predecessors).
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); nb + 1];
    for (b, ss) in succ.iter().enumerate() {
        for &s in ss {
            preds[s].push(b);
        }
    }
    let mut order = Vec::with_capacity(nb + 1);
    let mut po = vec![usize::MAX; nb + 1];
    let mut seen = vec![false; nb + 1];
    let mut stack = vec![(exit, 0usize)];
    seen[exit] = true;
    while let Some((node, idx)) = stack.pop() {
        if idx < preds[node].len() {
            stack.push((node, idx + 1));
            let p = preds[node][idx];
            if !seen[p] {
                seen[p] = true;
                stack.push((p, 0));
            }
        } else {
            po[node] = order.len();
            order.push(node);
        }
    }
    // Cooper-Harvey-Kennedy on the reverse graph.
    let mut ipdom = vec![usize::MAX; nb + 1];
    ipdom[exit] = exit;
    let mut changed = true;
    while changed {
        changed = false;
        ticker.tick(order.len() as u64, line)?;
        for &b in order.iter().rev() {
            if b == exit {
                continue;
            }
            let mut new = usize::MAX;
            for &s in &succ[b] {
                if ipdom[s] == usize::MAX {
                    continue;
                }
                new = if new == usize::MAX {
                    s
                } else {
                    intersect(&ipdom, &po, new, s)
                };
            }
            if new != usize::MAX && ipdom[b] != new {
                ipdom[b] = new;
                changed = true;
            }
        }
    }
    for (i, ins) in code.iter_mut().enumerate() {
        if let Op::Bra { rpc, .. } = &mut ins.op {
            let p = ipdom[block_of[i]];
            *rpc = if p == usize::MAX || p == exit {
                NONE
            } else {
                starts[p] as u32
            };
        }
    }
    Ok(())
}

fn intersect(ipdom: &[usize], po: &[usize], mut a: usize, mut b: usize) -> usize {
    while a != b {
        while po[a] < po[b] {
            a = ipdom[a];
        }
        while po[b] < po[a] {
            b = ipdom[b];
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(op: Op, guarded: bool) -> Inst {
        Inst {
            op,
            guard: if guarded { 0 } else { NONE },
            guard_neg: false,
            line: 0,
        }
    }

    #[test]
    fn if_else_and_loop_reconverge() {
        // 0: @p bra 3 ; 1: nop ; 2: bra 4 ; 3: nop ; 4: @p bra 4 (self loop) ; 5: ret
        let mut code = vec![
            inst(Op::Bra { target: 3, rpc: 0 }, true),
            inst(Op::Nop, false),
            inst(Op::Bra { target: 4, rpc: 0 }, false),
            inst(Op::Nop, false),
            inst(Op::Bra { target: 4, rpc: 0 }, true),
            inst(Op::Ret, false),
        ];
        assign_reconvergence(&mut code);
        let rpc = |i: usize| match code[i].op {
            Op::Bra { rpc, .. } => rpc,
            _ => unreachable!(),
        };
        assert_eq!(rpc(0), 4);
        assert_eq!(rpc(4), 5);
    }

    #[test]
    fn early_exit_has_no_reconvergence() {
        // 0: @p bra 2 ; 1: exit ; 2: ret
        let mut code = vec![
            inst(Op::Bra { target: 2, rpc: 0 }, true),
            inst(Op::Exit, false),
            inst(Op::Ret, false),
        ];
        assign_reconvergence(&mut code);
        assert!(matches!(code[0].op, Op::Bra { rpc: NONE, .. }));
    }

    #[test]
    fn infinite_loop_does_not_hang() {
        let mut code = vec![
            inst(Op::Bra { target: 0, rpc: 0 }, true),
            inst(Op::Bra { target: 0, rpc: 0 }, false),
        ];
        assign_reconvergence(&mut code);
        assert!(matches!(code[0].op, Op::Bra { rpc: NONE, .. }));
    }
}
