//! A kernel's loops from its machine code's control flow, and its main loop: the
//! innermost loop that holds the most tensor-core instructions (HMMA).
//!
//! The instructions are cut into basic blocks (a block starts at the entry, at a branch
//! target and after a branch, `EXIT` or `RET`). A block's successors: a branch's target,
//! and the next block unless the block ends in an unconditional branch, `EXIT` or `RET`.
//! `CALL` falls through: a called subroutine (ptxas's slow paths, e.g. of division) is
//! not part of its caller's loops.
//!
//! Every backward branch (target at or before the branch) is a candidate back edge to a
//! loop header `h`; the loop's body is `h` and every block that reaches the branch
//! without passing through `h` (a natural loop), so a block ptxas placed out of line,
//! after the loop's end, still counts when it jumps back into the loop, and a path that
//! leaves the loop does not. A backward branch whose target does not dominate it (the
//! walk reaches the kernel's entry) heads no loop. Back edges to one header make one
//! loop.
//!
//! The main loop: the loops with the most HMMA, without those that contain another of
//! them (the innermost); where several disjoint loops remain (ptxas made versions of one
//! loop for different run-time paths), the largest, since any of them may run.

use std::collections::{BTreeMap, BTreeSet};

use crate::sass::Instr;

/// One natural loop.
#[derive(Debug, Clone, PartialEq)]
pub struct Loop {
    /// Address of the header's first instruction.
    pub header: u32,
    /// Indices of the instructions in the body, ascending.
    pub body: Vec<usize>,
    /// How many of the body's instructions have each base opcode (`HMMA`, `LDS`, ...).
    pub ops: BTreeMap<String, u32>,
}

impl Loop {
    pub fn instructions(&self) -> u32 {
        self.body.len() as u32
    }
    pub fn count(&self, base: &str) -> u32 {
        self.ops.get(base).copied().unwrap_or(0)
    }
    pub fn mma(&self) -> u32 {
        self.count("HMMA")
    }
}

fn ends_block(i: &Instr) -> bool {
    i.target.is_some() && !i.never() || matches!(i.base(), "EXIT" | "RET" | "BRX" | "JMX")
}

/// Whether control can go on to the next instruction after `i`.
fn falls_through(i: &Instr) -> bool {
    i.never() || i.conditional() || !(i.target.is_some() || ends_block(i))
}

/// Basic blocks as [start, end) instruction ranges, with their successors.
struct Cfg {
    blocks: Vec<(usize, usize)>,
    succ: Vec<Vec<usize>>,
    pred: Vec<Vec<usize>>,
}

fn cfg(instrs: &[Instr]) -> Cfg {
    let index: BTreeMap<u32, usize> = instrs
        .iter()
        .enumerate()
        .map(|(i, x)| (x.addr, i))
        .collect();
    let mut leaders = BTreeSet::from([0usize]);
    for (i, x) in instrs.iter().enumerate() {
        if x.never() {
            continue;
        }
        if let Some(t) = x.target.and_then(|t| index.get(&t)) {
            leaders.insert(*t);
        }
        if ends_block(x) && i + 1 < instrs.len() {
            leaders.insert(i + 1);
        }
    }
    let starts: Vec<usize> = leaders.into_iter().filter(|&s| s < instrs.len()).collect();
    let blocks: Vec<(usize, usize)> = starts
        .iter()
        .enumerate()
        .map(|(b, &s)| (s, starts.get(b + 1).copied().unwrap_or(instrs.len())))
        .collect();
    let block_of = |i: usize| starts.partition_point(|&s| s <= i) - 1;
    let mut succ = vec![Vec::new(); blocks.len()];
    for (b, &(_, end)) in blocks.iter().enumerate() {
        let last = &instrs[end - 1];
        if !last.never() {
            if let Some(t) = last.target.and_then(|t| index.get(&t)) {
                succ[b].push(block_of(*t));
            }
        }
        if falls_through(last) && end < instrs.len() {
            succ[b].push(b + 1);
        }
        succ[b].dedup();
    }
    let mut pred = vec![Vec::new(); blocks.len()];
    for (b, s) in succ.iter().enumerate() {
        for &t in s {
            pred[t].push(b);
        }
    }
    Cfg { blocks, succ, pred }
}

/// The natural loops of a kernel, by header address.
pub fn loops(instrs: &[Instr]) -> Vec<Loop> {
    if instrs.is_empty() {
        return Vec::new();
    }
    let g = cfg(instrs);
    let mut bodies: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for (latch, succ) in g.succ.iter().enumerate() {
        for &header in succ {
            if g.blocks[header].0 > g.blocks[latch].0 {
                continue; // a forward edge
            }
            let (s, e) = g.blocks[latch];
            if header == latch && e - s == 1 && !instrs[s].conditional() {
                continue; // `BRA self` after the last EXIT: ptxas's trap, not a loop
            }
            // Walk back from the latch; reaching the entry means header does not
            // dominate latch.
            let mut body = BTreeSet::from([header, latch]);
            let mut work = vec![latch];
            let mut natural = true;
            while let Some(b) = work.pop() {
                if b == header {
                    continue;
                }
                if b == 0 {
                    natural = false;
                    break;
                }
                for &p in &g.pred[b] {
                    if body.insert(p) {
                        work.push(p);
                    }
                }
            }
            if natural {
                bodies.entry(header).or_default().extend(body);
            }
        }
    }
    bodies
        .into_iter()
        .map(|(header, blocks)| {
            let body: Vec<usize> = blocks
                .iter()
                .flat_map(|&b| g.blocks[b].0..g.blocks[b].1)
                .collect();
            let mut ops = BTreeMap::new();
            for &i in &body {
                *ops.entry(instrs[i].base().to_string()).or_insert(0) += 1;
            }
            Loop {
                header: instrs[g.blocks[header].0].addr,
                body,
                ops,
            }
        })
        .collect()
}

/// The main loop (see the module doc) and how many versions of it there are; None when
/// no loop holds an HMMA.
pub fn main_loop(loops: &[Loop]) -> Option<(&Loop, usize)> {
    let most = loops.iter().map(Loop::mma).max().filter(|&m| m > 0)?;
    let top: Vec<&Loop> = loops.iter().filter(|l| l.mma() == most).collect();
    let contains = |outer: &Loop, inner: &Loop| {
        outer.header != inner.header && outer.body.binary_search(&inner.body[0]).is_ok()
    };
    let innermost: Vec<&Loop> = top
        .iter()
        .copied()
        .filter(|l| !top.iter().any(|other| contains(l, other)))
        .collect();
    let versions = innermost.len();
    innermost
        .into_iter()
        .max_by_key(|l| (l.instructions(), std::cmp::Reverse(l.header)))
        .map(|l| (l, versions))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sass;

    fn kernel(fixture: &str, name: &str) -> Vec<Instr> {
        sass::parse(fixture)
            .into_iter()
            .flat_map(|c| c.kernels)
            .find(|k| k.name == name)
            .unwrap_or_else(|| panic!("no kernel {name} in the fixture"))
            .instrs
    }

    const LOOPS: &str = include_str!("../fixtures/sass/loops.sass");

    #[test]
    fn a_loop_without_mma_is_found_and_is_no_main_loop() {
        let l = loops(&kernel(LOOPS, "simt_loop"));
        assert_eq!(
            l.len(),
            1,
            "one loop; the trailing `BRA self` is no loop: {l:?}"
        );
        assert_eq!(l[0].header, 0x30);
        assert_eq!(l[0].instructions(), 4);
        assert_eq!(l[0].count("FFMA"), 2);
        assert_eq!(main_loop(&l), None);
    }

    #[test]
    fn the_main_loop_holds_the_mma_and_its_inner_copy_loop() {
        let l = loops(&kernel(LOOPS, "nested_copy"));
        assert_eq!(l.len(), 3, "{l:?}");
        let (m, versions) = main_loop(&l).expect("a main loop");
        assert_eq!((m.header, versions), (0x20, 1));
        // 0x20..=0xb0: the outer loop, its inner copy loop (0x30..=0x50) included.
        assert_eq!(m.instructions(), 10);
        assert_eq!((m.mma(), m.count("LDGSTS"), m.count("BRA")), (2, 1, 2));
    }

    #[test]
    fn the_innermost_of_nested_loops_with_the_same_mma_is_the_main_loop() {
        let l = loops(&kernel(LOOPS, "nested_mma"));
        assert_eq!(l.len(), 2, "{l:?}");
        let (m, _) = main_loop(&l).expect("a main loop");
        assert_eq!(m.header, 0x30);
        assert_eq!((m.instructions(), m.mma()), (4, 2));
    }

    #[test]
    fn predicated_paths_out_of_line_blocks_and_exits() {
        let l = loops(&kernel(LOOPS, "predicated"));
        // 0x60 → 0x20 is backward but 0x20 does not dominate 0x60 (0x60 is reached from
        // the entry past the loop): no loop.
        assert_eq!(l.len(), 1, "{l:?}");
        let m = &l[0];
        assert_eq!(m.header, 0x100);
        // In the body: 0x100..=0x150 (the skipped block too) and the out-of-line block at
        // 0x200..=0x210 that jumps back; not the exit path at 0x160.
        let instrs = kernel(LOOPS, "predicated");
        let got: Vec<u32> = m.body.iter().map(|&i| instrs[i].addr).collect();
        assert_eq!(
            got,
            [0x100, 0x110, 0x120, 0x130, 0x140, 0x150, 0x200, 0x210]
        );
        assert_eq!((m.mma(), m.count("BRA")), (2, 4));
    }

    #[test]
    fn versions_of_one_loop_count_and_the_largest_is_reported() {
        let l = loops(&kernel(LOOPS, "versions"));
        assert_eq!(l.len(), 2, "{l:?}");
        let (m, versions) = main_loop(&l).expect("a main loop");
        assert_eq!(versions, 2);
        assert_eq!((m.header, m.instructions(), m.mma()), (0x80, 5, 1));
    }
}
