//! The typed snapshot of an engine handle's counters: what its tests read
//! by field and what `stats().detail` (`pmhash inspect`, the bench JSON)
//! lists, generated from the same declaration.

use super::*;

engine::tallies! {
    /// What an OP-HMEH handle holds and did since it was opened
    /// ([`Hmeh::tallies`]). The structural counts live in DRAM: a table
    /// opened again starts them at zero.
    pub struct Tallies {
        /// Bytes per segment (the geometry chosen at create).
        segment_bytes: u64 => "segment bytes",
        /// Live segments.
        segments: u64 => "segments",
        /// The FS-directory's global depth.
        global_depth: u32 => "global depth",
        /// Segment splits.
        splits: u64 => "splits",
        /// RT-directory node splits.
        node_splits: u64 => "node splits",
        /// Splits whose new segment's flush was delayed under a backup
        /// (relaxed durability).
        delayed_splits: u64 => "delayed splits",
        /// FS-directory doublings.
        doublings: u64 => "doublings",
        /// Segment merges.
        merges: u64 => "merges",
        /// Merges refused for where the two buddies sit in the
        /// RT-directory; a segment is refused once under each identity,
        /// then remembers it.
        merge_refusals: u64 => "merge refusals",
        /// Overflow blocks chained at the depth cap.
        overflow_blocks: u64 => "overflow blocks",
        /// RT-node backups made (relaxed durability).
        backups_made: u64 => "backups made",
        /// Items recovery merged back from backups.
        backups_merged: u64 => "backup items merged",
        /// Duplicate copies of a key recovery removed.
        duplicates_removed: u64 => "duplicates removed",
        /// Slots the clean open's count read (0: no walk at this open).
        clean_open_slots_read: u64 => "clean-open slots read",
        /// Slot writes (inserts and split copies) that needed the
        /// special-case write: an invalidating word 0 first.
        special_case_writes: u64 => "special-case writes",
        /// Items displaced to make room.
        displacements: u64 => "displacements",
        /// Updates written in place.
        inplace_updates: u64 => "in-place updates",
        /// Updates moved to another slot of the same cache line.
        same_line_updates: u64 => "same-line updates",
        /// Updates moved to a slot on another cache line.
        cross_line_updates: u64 => "cross-line updates",
        /// The highest load factor seen (including the current one).
        max_load_factor: engine::Fixed<4> => "max load factor",
        /// The lowest load factor at which a split was needed (`None`
        /// before the first split).
        min_load_factor_at_split: Option<engine::Fixed<4>> => "min load factor at split",
    }
}

impl Hmeh {
    /// A snapshot of this handle's figures (the counts since it was
    /// opened, the table's size and shape now): what `stats().detail`
    /// lists, by field.
    pub fn tallies(&self) -> Tallies {
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let segments = c(&self.t.segments);
        let capacity = segments * self.geo.slots();
        let current = self.len() as f64 / capacity.max(1) as f64;
        let min_split = f64::from_bits(c(&self.t.min_split_lf_bits));
        Tallies {
            segment_bytes: self.geo.bytes(),
            segments,
            global_depth: self.dir.current().gd,
            splits: c(&self.t.splits),
            node_splits: c(&self.t.node_splits),
            delayed_splits: c(&self.t.delayed_splits),
            doublings: c(&self.t.doublings),
            merges: c(&self.t.merges),
            merge_refusals: c(&self.t.merge_refusals),
            overflow_blocks: c(&self.t.overflow_blocks),
            backups_made: c(&self.t.backups_made),
            backups_merged: c(&self.t.backups_merged),
            duplicates_removed: c(&self.t.duplicates_removed),
            clean_open_slots_read: c(&self.t.clean_walk_slots),
            special_case_writes: c(&self.t.special_writes),
            displacements: c(&self.t.displacements),
            inplace_updates: c(&self.t.inplace_updates),
            same_line_updates: c(&self.t.line_updates),
            cross_line_updates: c(&self.t.cross_updates),
            max_load_factor: engine::Fixed(f64::from_bits(c(&self.t.max_lf_bits)).max(current)),
            // Stored as f64::MAX until the first split.
            min_load_factor_at_split: (min_split <= 1.0).then_some(engine::Fixed(min_split)),
        }
    }
}
