//! The engine's figures as a typed snapshot ([`Tallies`]), from which
//! `Stats::detail` (what `pmhash inspect` prints) is generated.

use std::sync::atomic::{AtomicU64, Ordering};

use engine::{Figure, Fixed};

use crate::{Level, BOT, TOP};

/// An item count summed over per-thread shards: a read that races writers
/// may see it below zero for a moment, and it prints as the signed sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Items(pub i64);

impl Figure for Items {
    fn show(&self) -> String {
        self.0.to_string()
    }
    fn read(s: &str) -> Option<Self> {
        s.parse().ok().map(Items)
    }
}

engine::tallies! {
    /// What a level table holds and has done since it was opened
    /// ([`Level::tallies`]); `Stats::detail` lists these in this order.
    pub struct Tallies {
        /// Buckets in the top level.
        top_buckets: u64 => "top buckets",
        /// Buckets in the bottom level.
        bottom_buckets: u64 => "bottom buckets",
        /// Items in the top level.
        top_items: Items => "top items",
        /// Items in the bottom level.
        bottom_items: Items => "bottom items",
        /// Expansions done.
        expansions: u64 => "expansions",
        /// Buckets the clean open's count read (0: no scan at this open).
        clean_open_buckets_read: u64 => "clean-open buckets read",
        /// Shrinks done.
        shrinks: u64 => "shrinks",
        /// Rehashes of the interim level that more than one thread shared.
        parallel_rehashes: u64 => "parallel rehashes",
        /// One-item movements (top or bottom level) that made room.
        movements: u64 => "movements",
        /// Bottom-to-top movements that made room.
        b2t_movements: u64 => "b2t movements",
        /// Updates done log-free (new slot and both tokens in one store).
        logfree_updates: u64 => "log-free updates",
        /// Updates done through the undo log (the line was full).
        logged_updates: u64 => "logged updates",
        /// The highest load factor seen.
        max_load_factor: Fixed<4> => "max load factor",
        /// The load at the worst insertion failure: the load the table is
        /// sure to reach before it expands (none: no insertion has failed).
        min_load_factor_at_expansion: Option<Fixed<4>> => "min load factor at expansion",
    }
}

impl Level {
    /// A snapshot of the table's figures: its levels' sizes and items, and
    /// what it has done since it was opened (resizes, movements, updates by
    /// path, load factors). Each read is a relaxed load: a snapshot taken
    /// while writers run mixes moments.
    pub fn tallies(&self) -> Tallies {
        let (_, g) = self.geo_read();
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let min_lf = f64::from_bits(c(&self.min_lf_bits));
        Tallies {
            top_buckets: g.lv[TOP].n,
            bottom_buckets: g.lv[BOT].n,
            top_items: Items(self.counts[TOP].get()),
            bottom_items: Items(self.counts[BOT].get()),
            expansions: c(&self.expansions),
            clean_open_buckets_read: c(&self.clean_scan_buckets),
            shrinks: c(&self.shrinks),
            parallel_rehashes: c(&self.parallel_rehashes),
            movements: c(&self.moves),
            b2t_movements: c(&self.b2t_moves),
            logfree_updates: c(&self.logfree_updates),
            logged_updates: c(&self.logged_updates),
            max_load_factor: Fixed(f64::from_bits(c(&self.max_lf_bits))),
            min_load_factor_at_expansion: (min_lf <= 1.0).then_some(Fixed(min_lf)),
        }
    }
}
