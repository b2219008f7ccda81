//! The RT-directory: a radix tree of 64-byte PM nodes over hash prefixes,
//! 8 entries (3 bits) per level. It changes only when a segment splits or
//! merges; the FS-directory is rebuilt from it at open.
//!
//! One concept, this PM structure alone: finding a segment's run, the
//! run repair of recovery, and the walk; the splits and merges that write
//! its nodes are in `split.rs`.

use std::collections::HashSet;

use pmem::Pool;

use crate::layout::{Ident, LINE, NODE_BITS, NODE_FANOUT};
use engine::{Error, Result};

/// The deepest node: depth 36 covers local depth 32 (the limit).
pub(crate) const MAX_NODE_DEPTH: u32 = 36;

/// Where a segment's run of entries sits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pos {
    pub(crate) node: u64,
    /// Prefix bits this node resolves down to (3 × level).
    pub(crate) depth: u32,
    /// First entry of the run.
    pub(crate) start: u64,
    /// Entries in the run: 2^(depth - ld).
    pub(crate) len: u64,
}

impl Pos {
    pub(crate) fn entry(&self, i: u64) -> u64 {
        self.node + i * 8
    }
}

#[inline]
pub(crate) fn is_child(e: u64) -> bool {
    e & 1 == 1
}

/// Entry index of hash high word `hi` (as a 64-bit prefix) in a node of `depth`.
#[inline]
fn slot_of(prefix64: u64, depth: u32) -> u64 {
    (prefix64 >> (64 - depth)) & (NODE_FANOUT - 1)
}

/// Finds the run of the segment with identity `id` (the tree is assumed
/// consistent: called by writers holding the segment's lock).
pub(crate) fn find(pool: &Pool, root_node: u64, id: Ident) -> Pos {
    let p = (id.prefix as u64) << 32;
    let mut node = root_node;
    let mut depth = NODE_BITS;
    loop {
        let i = slot_of(p, depth);
        let e = pool.load_u64(node + i * 8);
        // Descend to the deepest node on the path: a segment's run may
        // fill a whole child node (LD = the child's depth - 3, left by a
        // merge or a rolled-back node split).
        if is_child(e) {
            node = e & !1;
            depth += NODE_BITS;
            continue;
        }
        let len = 1u64 << (depth - id.ld);
        return Pos {
            node,
            depth,
            start: i & !(len - 1),
            len,
        };
    }
}

/// Reads and checks a node pointer.
fn node_ok(pool: &Pool, off: u64) -> Result<()> {
    if !off.is_multiple_of(LINE) || pool.block_size(off).ok() != Some(LINE) {
        return Err(Error::Corrupt(format!(
            "RT node at {off:#x} is not an allocated 64-byte block"
        )));
    }
    Ok(())
}

/// Crash repair (paper §3.5): in every node, each run starts at an entry
/// whose segment's LD fixes the run's length; entries of the run that name
/// another segment are pointed back at the first. Returns the nodes it
/// changed (the caller persists them). Compares pointers, never reads a
/// segment a repair discards (recovery may already have freed it).
///
/// With `fix` false nothing is written: the nodes that need a repair are
/// returned (a check).
pub(crate) fn repair(
    pool: &Pool,
    root_node: u64,
    ident_of: &(dyn Fn(u64) -> Result<Ident> + Sync),
    fix: bool,
) -> Result<Repair> {
    // The root alone, then its subtrees on up to 4 threads: a clean open
    // is dominated by first touches of segment headers (page faults on a
    // fresh mapping), which proceed in parallel.
    let mut out = Repair::default();
    let mut below = Vec::new();
    let mut seen = HashSet::new();
    repair_node(
        pool,
        (root_node, NODE_BITS, 0),
        ident_of,
        fix,
        &mut out,
        &mut below,
        &mut seen,
    )?;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4)
        .min(below.len().max(1));
    if threads <= 1 {
        let mut stack = below;
        while let Some(n) = stack.pop() {
            repair_node(pool, n, ident_of, fix, &mut out, &mut stack, &mut seen)?;
        }
        return Ok(out);
    }
    let parts: Vec<Result<Repair>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mut stack: Vec<(u64, u32, u64)> =
                    below.iter().skip(t).step_by(threads).copied().collect();
                sc.spawn(move || -> Result<Repair> {
                    let mut part = Repair::default();
                    let mut seen = HashSet::new();
                    while let Some(n) = stack.pop() {
                        repair_node(pool, n, ident_of, fix, &mut part, &mut stack, &mut seen)?;
                    }
                    Ok(part)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Corrupt("RT walk panicked".into())))
            })
            .collect()
    });
    for part in parts {
        let part = part?;
        out.changed.extend(part.changed);
        out.nodes.extend(part.nodes);
        out.segments.extend(part.segments);
    }
    Ok(out)
}

/// Repairs (or checks) one node's runs; pushes its children on `stack`.
/// A node is (offset, depth, path): `path` is the integer of the prefix
/// bits above this node (depth − 3 of them). Every segment's identity must
/// agree with where the tree holds it, and no node may be reached twice
/// (a loop or a shared subtree in a corrupt file).
fn repair_node(
    pool: &Pool,
    (node, depth, path): (u64, u32, u64),
    ident_of: &(dyn Fn(u64) -> Result<Ident> + Sync),
    fix: bool,
    out: &mut Repair,
    stack: &mut Vec<(u64, u32, u64)>,
    seen: &mut HashSet<u64>,
) -> Result<()> {
    node_ok(pool, node)?;
    if !seen.insert(node) {
        return Err(Error::Corrupt(format!(
            "RT node {node:#x} is reached twice (a loop or a shared subtree)"
        )));
    }
    out.nodes.push(node);
    let mut i = 0;
    let mut dirty = false;
    while i < NODE_FANOUT {
        let e = pool.load_u64(node + i * 8);
        if is_child(e) {
            if depth + NODE_BITS > MAX_NODE_DEPTH {
                return Err(Error::Corrupt(format!(
                    "RT node at {node:#x} has a child below the deepest level"
                )));
            }
            stack.push((e & !1, depth + NODE_BITS, (path << NODE_BITS) | i));
            i += 1;
            continue;
        }
        let id = ident_of(e)?;
        let min = if depth == NODE_BITS {
            1
        } else {
            depth - NODE_BITS
        };
        if id.ld < min || id.ld > depth {
            return Err(Error::Corrupt(format!(
                "segment {e:#x} of local depth {} sits in an RT node of depth {depth}",
                id.ld
            )));
        }
        let len = 1u64 << (depth - id.ld);
        out.segments.push((e, id));
        if i % len != 0 {
            return Err(Error::Corrupt(format!(
                "segment {e:#x} starts a run at entry {i} of node {node:#x}, not a multiple of {len}"
            )));
        }
        // The run's position spells the segment's prefix.
        if ((path << NODE_BITS) | i) >> (depth - id.ld) != id.index() {
            return Err(Error::Corrupt(format!(
                "segment {e:#x} has prefix {:#x}/{} but sits at entry {i} of RT node {node:#x} (depth {depth})",
                id.index(),
                id.ld
            )));
        }
        for j in i + 1..i + len {
            if pool.load_u64(node + j * 8) != e {
                if fix {
                    pool.store_u64(node + j * 8, e);
                }
                dirty = true;
            }
        }
        i += len;
    }
    if dirty {
        out.changed.push(node);
    }
    Ok(())
}

/// What a repair pass saw.
#[derive(Default)]
pub(crate) struct Repair {
    /// Nodes whose runs needed (or, with `fix`, got) a repair.
    pub(crate) changed: Vec<u64>,
    /// Every node of the tree.
    pub(crate) nodes: Vec<u64>,
    /// Every segment with its identity, once each.
    pub(crate) segments: Vec<(u64, Ident)>,
}

/// Calls `f(segment)` once per segment the tree names, and `node(n)` once
/// per node. The tree must be consistent (after `repair`).
pub(crate) fn walk(
    pool: &Pool,
    root_node: u64,
    mut node_f: impl FnMut(u64, u32) -> Result<()>,
    mut seg_f: impl FnMut(u64) -> Result<()>,
) -> Result<()> {
    let mut stack = vec![(root_node, NODE_BITS)];
    let mut seen = HashSet::new();
    while let Some((node, depth)) = stack.pop() {
        node_ok(pool, node)?;
        if !seen.insert(node) {
            return Err(Error::Corrupt(format!(
                "RT node {node:#x} is reached twice"
            )));
        }
        node_f(node, depth)?;
        let mut prev = 0;
        for i in 0..NODE_FANOUT {
            let e = pool.load_u64(node + i * 8);
            if is_child(e) {
                if depth + NODE_BITS > MAX_NODE_DEPTH {
                    return Err(Error::Corrupt(format!(
                        "RT node at {node:#x} has a child below the deepest level"
                    )));
                }
                stack.push((e & !1, depth + NODE_BITS));
                prev = 0;
            } else if e != prev {
                seg_f(e)?;
                prev = e;
            }
        }
    }
    Ok(())
}
