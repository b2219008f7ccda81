//! White-box tests: crash states built by hand (torn slots, half-done
//! splits), checked against recovery.
//!
//! - Torn cross-KV slots: the states a slot write can leave (its stores
//!   reach PM in program order within the line, so a crash leaves a
//!   prefix of them), crafted into images and recovered; the paper's
//!   phantom in the prefix-0 segment and the special-case write that
//!   keeps it out; every slot write of a whole workload torn in turn.
//! - A crashed update's two valid copies: recovery keeps exactly one.
//! - Split and merge crash windows: a crash image at every fence of the
//!   operation (persisted, newest, random, one line alone written back or
//!   alone lost, and every prefix of the RT node line's stores).
//! - Backups (relaxed): a node split's new segments lost, the backup
//!   restores their items, and recovery drops it.
//!
//! The simulator works at cache-line granularity; the intra-line states
//! (one word of a slot written, the other not) are built here by hand.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use engine::{Durability, Engine, EngineConfig};
use pmem::{CrashChoice, Mode, Pool, PoolOptions};

use super::*;

/// Results of the checks here: a message on failure.
type Res<T> = std::result::Result<T, String>;

const MIB: u64 = 1 << 20;
/// 1 KiB segments: a header line, 13 buckets, 2 stash buckets (60 slots).
const SEG_BYTES: u64 = 1024;

// ----- helpers ---------------------------------------------------------------------

use engine::testkit::Rng;

fn ecfg(d: Durability) -> EngineConfig {
    EngineConfig {
        durability: d,
        initial_capacity: 16,
        threads: 1,
    }
}

/// A simulated pool (1 MiB, growing to 16 MiB) with a fixed uuid, so the
/// hash seed and every allocation repeat from run to run.
fn fresh(d: Durability, hash: HashKind, tag: u64) -> (Arc<Pool>, Hmeh) {
    let mut uuid = [0u8; 16];
    uuid[..8].copy_from_slice(&tag.to_le_bytes());
    uuid[8..].copy_from_slice(b"hmehwbox");
    let pool = Arc::new(
        Pool::create(
            Path::new(""),
            &PoolOptions {
                mode: Mode::Simulated,
                size: MIB,
                max_size: 16 * MIB,
                layout: LAYOUT.into(),
                uuid: Some(uuid),
                ..PoolOptions::default()
            },
        )
        .unwrap(),
    );
    let opts = Options {
        segment_bytes: Some(SEG_BYTES),
        max_depth: DEFAULT_MAX_DEPTH,
        hash,
        stash_before_split: false,
    };
    let hm = Hmeh::create_with(pool.clone(), &ecfg(d), &opts).unwrap();
    assert_eq!(hm.segment_bytes(), SEG_BYTES);
    (pool, hm)
}

/// Pool and engine recovery of a crash image; a panic is an error too.
fn recover(img: Vec<u8>, d: Durability) -> Res<(Arc<Pool>, Hmeh)> {
    catch_unwind(AssertUnwindSafe(|| {
        let pool = Arc::new(
            Pool::from_image(img, Mode::Simulated).map_err(|e| format!("pool recovery: {e}"))?,
        );
        let hm = Hmeh::open(pool.clone(), &ecfg(d)).map_err(|e| format!("engine recovery: {e}"))?;
        Ok((pool, hm))
    }))
    .unwrap_or_else(|_| Err("recovery panicked".into()))
}

/// Every pair the walk finds; a key found twice is an error.
fn contents(hm: &Hmeh) -> Res<HashMap<u64, u64>> {
    let mut m = HashMap::new();
    let mut twice = None;
    hm.for_each(&mut |k, v| {
        if m.insert(k, v).is_some() && twice.is_none() {
            twice = Some(k);
        }
    });
    match twice {
        Some(k) => Err(format!("key {k:#x} is stored twice")),
        None => Ok(m),
    }
}

/// Which values each key may hold after recovery (`None`: absent); a key
/// not listed must be absent.
type Allowed = HashMap<u64, Vec<Option<u64>>>;

fn exact(m: &HashMap<u64, u64>) -> Allowed {
    m.iter().map(|(k, v)| (*k, vec![Some(*v)])).collect()
}

/// The recovered contents against what is allowed: nothing invented, no
/// value that was never written, nothing required lost.
fn judge(found: &HashMap<u64, u64>, allowed: &Allowed) -> Res<()> {
    let mut keys: Vec<_> = found.keys().collect();
    keys.sort_unstable();
    for k in keys {
        let v = found[k];
        match allowed.get(k) {
            Some(a) if a.contains(&Some(v)) => {}
            Some(a) => {
                return Err(format!(
                    "key {k:#x} recovered with value {v:#x}, allowed {a:x?}"
                ))
            }
            None => return Err(format!("invented key {k:#x} (value {v:#x})")),
        }
    }
    let mut lost: Vec<_> = allowed
        .iter()
        .filter(|(k, a)| !found.contains_key(k) && !a.contains(&None))
        .map(|(k, _)| *k)
        .collect();
    lost.sort_unstable();
    if let Some(k) = lost.first() {
        return Err(format!(
            "key {k:#x} lost ({} keys lost), allowed {:x?}",
            lost.len(),
            allowed[k]
        ));
    }
    Ok(())
}

/// The recovered table is sound: `check()` passes and agrees with the
/// walk, `len` and `get`; allocator bytes in use equal the bytes reachable
/// (no leak); no backup is left; it takes a new key.
fn sound(pool: &Pool, hm: &Hmeh, found: &HashMap<u64, u64>) -> Res<()> {
    let r = hm.check().map_err(|e| format!("check() failed: {e}"))?;
    if r.keys != found.len() as u64 || hm.len() != found.len() as u64 {
        return Err(format!(
            "check() counts {} keys, len() {}, the walk {}",
            r.keys,
            hm.len(),
            found.len()
        ));
    }
    let in_use = pool.stats().bytes_in_use;
    if r.reachable_bytes != in_use {
        return Err(format!(
            "{} bytes reachable but {in_use} in use: {} leaked",
            r.reachable_bytes,
            in_use as i64 - r.reachable_bytes as i64
        ));
    }
    for (k, v) in found {
        if hm.get(*k) != Some(*v) {
            return Err(format!(
                "get({k:#x}) = {:x?}, the walk found {v:#x}",
                hm.get(*k)
            ));
        }
    }
    for (s, _) in hm.segments().map_err(|e| e.to_string())? {
        if pool.load_u64(s + H_BACKUP) != 0 {
            return Err(format!("segment {s:#x} still names a backup"));
        }
    }
    let fresh = (0u64..)
        .map(|i| 0x5eed_0000_0000_0000 ^ i)
        .find(|k| !found.contains_key(k))
        .expect("a free key");
    match hm.insert(fresh, 42) {
        Ok(true) if hm.get(fresh) == Some(42) => {}
        other => return Err(format!("recovered table refused a new insert: {other:?}")),
    }
    hm.check()
        .map_err(|e| format!("check() failed after a new insert: {e}"))?;
    Ok(())
}

/// Recovers `img` and holds it to `allowed` and `sound`; returns the
/// recovered engine's tallies.
fn check_image(img: Vec<u8>, d: Durability, allowed: &Allowed) -> Res<Tallies> {
    let (pool, hm) = recover(img, d)?;
    let found = contents(&hm)?;
    judge(&found, allowed)?;
    let tallies = hm.tallies();
    sound(&pool, &hm, &found)?;
    Ok(tallies)
}

/// One slot of a live segment.
#[derive(Clone, Copy, Debug)]
struct At {
    seg: u64,
    id: Ident,
    line: u64,
    s: usize,
    bucket: Option<u64>,
}

impl At {
    fn w0(&self) -> u64 {
        self.line + 16 * self.s as u64
    }
    fn words(&self, pool: &Pool) -> (u64, u64) {
        (pool.load_u64(self.w0()), pool.load_u64(self.w0() + 8))
    }
}

/// Every slot of every live segment (buckets, stash, overflow).
fn all_slots(hm: &Hmeh) -> Vec<At> {
    let mut v = Vec::new();
    for (seg, id) in hm.segments().unwrap() {
        hm.each_slot(seg, &mut |line, s, bucket, _| {
            v.push(At {
                seg,
                id,
                line,
                s,
                bucket,
            })
        });
    }
    v
}

/// The slot that holds `key`.
fn slot_of(hm: &Hmeh, key: u64) -> Option<At> {
    let h = hm.hasher.hash(key);
    all_slots(hm).into_iter().find(|a| {
        let (w0, w1) = a.words(&hm.pool);
        hm.valid(a.id, w0, w1, a.bucket) && decode_slot(w0, w1).0 == h
    })
}

/// The layout's validity rule (layout.rs docs), written out again here
/// rather than calling the engine's `valid`.
fn valid_by_layout(geo: &Geometry, id: Ident, w0: u64, w1: u64, bucket: Option<u64>) -> bool {
    let h = (w0 >> 32) << 32 | w1 >> 32;
    let top = if id.ld == 0 {
        0
    } else {
        u32::MAX << (32 - id.ld)
    };
    if h == 0 || ((h >> 32) as u32 ^ id.prefix) & top != 0 {
        return false;
    }
    match bucket {
        None => true,
        Some(b) => {
            let home = ((h & 0xffff_ffff) * geo.buckets) >> 32;
            (b + geo.buckets - home) % geo.buckets < PROBE
        }
    }
}

fn put(img: &mut [u8], off: u64, w: u64) {
    img[off as usize..off as usize + 8].copy_from_slice(&w.to_le_bytes());
}

fn get(img: &[u8], off: u64) -> u64 {
    u64::from_le_bytes(img[off as usize..off as usize + 8].try_into().unwrap())
}

fn put_slot(img: &mut [u8], at: &At, w0: u64, w1: u64) {
    put(img, at.w0(), w0);
    put(img, at.w0() + 8, w1);
}

fn tally(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

// ----- torn cross-KV slots ---------------------------------------------------------

/// The paper's phantom: with word 1 stored first, an insert into an empty
/// slot of the prefix-0 segment passes through (0, new word 1), which
/// reads as a valid item (hash = the new hash's low word, high word 0,
/// owned by prefix 0; the stash has no window). The engine's special-case
/// write stores an invalidating word 0 first; every state its stores can
/// leave recovers without the phantom. In the other segment the same
/// insert needs no special case.
#[test]
fn special_case_write_keeps_the_prefix_zero_phantom_out() {
    let d = Durability::Strict;
    let (pool, hm) = fresh(d, HashKind::Identity, 1);
    // Identity hash: hash = key. Two segments of local depth 1.
    let segs = hm.segments().unwrap();
    assert_eq!(segs.len(), 2, "initial capacity 16 makes two segments");
    let (seg0, id0) = *segs.iter().find(|(_, id)| id.prefix == 0).unwrap();
    let (seg1, id1) = *segs.iter().find(|(_, id)| id.prefix != 0).unwrap();
    // Keys of home bucket 0 (small low word) owned by prefix 0.
    let key = |hi: u64| hi << 32 | (0x1000 + hi);
    let value = |hi: u64| 0xabcd_0000_0000_0000 | hi << 32 | hi;
    let mut model = HashMap::new();
    for hi in 1..=16 {
        assert_eq!(hm.geo.home(key(hi)), 0);
        assert!(hm.insert(key(hi), value(hi)).unwrap());
        model.insert(key(hi), value(hi));
    }
    // Buckets 0..3 (the window of home 0) are full: the next one goes to
    // the stash.
    for b in 0..PROBE {
        let w = hm.pool.words(hm.geo.bucket(seg0, b), 8);
        for s in 0..SLOTS {
            let (w0, w1) = (
                w[2 * s].load(Ordering::Relaxed),
                w[2 * s + 1].load(Ordering::Relaxed),
            );
            assert!(
                hm.valid(id0, w0, w1, Some(b)),
                "bucket {b} slot {s} not full"
            );
        }
    }
    let target = At {
        seg: seg0,
        id: id0,
        line: hm.geo.stash_bucket(seg0, 0),
        s: 0,
        bucket: None,
    };
    assert_eq!(target.words(&pool), (0, 0), "the first stash slot is empty");
    let (k, v) = (key(17), 0xdead_beef_0000_1234u64);
    let before = hm.tallies().special_case_writes;
    assert!(hm.insert(k, v).unwrap());
    assert_eq!(
        hm.tallies().special_case_writes - before,
        1,
        "an insert into an empty prefix-0 stash slot needs the special-case write"
    );
    let (n0, n1) = target.words(&pool);
    assert_eq!(
        (n0, n1),
        encode_slot(k, v),
        "the key went to the first stash slot"
    );

    // The naive intermediate state (old word 0, new word 1) is a valid item.
    assert!(hm.valid(id0, 0, n1, None));
    assert!(valid_by_layout(&hm.geo, id0, 0, n1, None));
    let phantom = hm.hasher.key(decode_slot(0, n1).0);
    assert_ne!(phantom, k);
    assert!(!model.contains_key(&phantom));
    let img = pool.crash_image(CrashChoice::Persisted).unwrap();
    {
        let mut naive = img.clone();
        put_slot(&mut naive, &target, 0, n1);
        let (_p, r) = recover(naive, d).unwrap();
        let found = contents(&r).unwrap();
        assert_eq!(
            found.get(&phantom),
            Some(&(v & 0xffff_ffff)),
            "the naive torn state should read as the phantom {phantom:#x}"
        );
    }
    // Every prefix of the engine's stores: invalidating word 0, word 1, word 0.
    let inv = id0.invalid_hi() << 32;
    for (w0, w1, present) in [
        (0, 0, false),
        (inv, 0, false),
        (inv, n1, false),
        (n0, n1, true),
    ] {
        let mut t = img.clone();
        put_slot(&mut t, &target, w0, w1);
        let mut allowed = exact(&model);
        allowed.insert(k, vec![if present { Some(v) } else { None }]);
        check_image(t, d, &allowed).unwrap_or_else(|e| panic!("slot ({w0:#x}, {w1:#x}): {e}"));
    }

    // The prefix-0x8000_0000 segment: (0, new word 1) is not owned there,
    // so no special case, and the torn state recovers without the key.
    model.insert(k, v);
    let k2 = 0x8000_0001u64 << 32 | 0x1000;
    let before = hm.tallies().special_case_writes;
    assert!(hm.insert(k2, 77 << 32 | 78).unwrap());
    assert_eq!(hm.tallies().special_case_writes, before);
    let at = slot_of(&hm, k2).unwrap();
    assert_eq!(at.seg, seg1);
    let (_, m1) = at.words(&pool);
    assert!(!hm.valid(id1, 0, m1, at.bucket));
    let mut t = pool.crash_image(CrashChoice::Persisted).unwrap();
    put_slot(&mut t, &at, 0, m1);
    check_image(t, d, &exact(&model)).unwrap();
}

/// Hand-made torn and misplaced slots in an image of a grown table with
/// deletions: each recovers with nothing invented, no value that was
/// never written, every untouched key intact, and a sound table.
#[test]
fn torn_and_misplaced_slots_recover_without_phantoms() {
    let d = Durability::Strict;
    let (pool, hm) = fresh(d, HashKind::Mixed, 2);
    let mut rng = Rng(2);
    let mut model = HashMap::new();
    let mut order = Vec::new();
    while model.len() < 400 {
        let (k, v) = (rng.next(), rng.next());
        assert!(hm.insert(k, v).unwrap());
        model.insert(k, v);
        order.push(k);
    }
    for k in order.iter().step_by(5) {
        assert!(hm.remove(*k).unwrap());
        model.remove(k);
    }
    assert!(hm.tallies().splits >= 4, "the table should have split");
    let img = pool.crash_image(CrashChoice::Persisted).unwrap();
    check_image(img.clone(), d, &exact(&model)).expect("the untouched image recovers");

    let slots = all_slots(&hm);
    let live: Vec<(At, u64, u64)> = slots
        .iter()
        .filter_map(|a| {
            let (w0, w1) = a.words(&pool);
            hm.valid(a.id, w0, w1, a.bucket).then_some((*a, w0, w1))
        })
        .collect();
    let key_of = |w0: u64, w1: u64| hm.hasher.key(decode_slot(w0, w1).0);
    // (state, key that may be lost by it)
    let mut cases: Vec<(String, Vec<u8>, Option<u64>)> = Vec::new();
    let mut count = HashMap::<&str, usize>::new();
    let mut add = |what: &'static str, at: &At, w0: u64, w1: u64, may_lose: Option<u64>| {
        let c = count.entry(what).or_default();
        if *c >= 6 {
            return;
        }
        *c += 1;
        let mut t = img.clone();
        put_slot(&mut t, at, w0, w1);
        cases.push((
            format!("{what}: slot {:#x}/{} ← ({w0:#x}, {w1:#x})", at.line, at.s),
            t,
            may_lose,
        ));
    };
    for a in &slots {
        let (w0, w1) = a.words(&pool);
        if hm.valid(a.id, w0, w1, a.bucket) {
            continue;
        }
        let h = decode_slot(w0, w1).0;
        let other = live[(a.line as usize / 64 + a.s) % live.len()];
        let same_seg = live.iter().find(|(b, _, _)| b.seg == a.seg).copied();
        if w0 == a.id.invalid_hi() << 32 {
            // A killed slot being reused: (killed word 0, new word 1).
            add("killed word 0 + new word 1", a, w0, other.2, None);
        } else if h != 0 {
            // A stale copy left by a split, being overwritten by an item of
            // this segment: (stale word 0, new word 1).
            if let Some((_, _, n1)) = same_seg {
                add("stale word 0 + new word 1", a, w0, n1, None);
            }
        } else {
            // An empty slot: an item that hashes elsewhere (another
            // segment's item), and one outside its probe window.
            if let Some((_, o0, o1)) = live
                .iter()
                .find(|(b, o0, o1)| b.seg != a.seg && !a.id.owns(decode_slot(*o0, *o1).0))
            {
                add("another segment's item", a, *o0, *o1, None);
            }
            if let (Some(bk), Some((_, o0, o1))) = (a.bucket, same_seg) {
                let home = hm.geo.home(decode_slot(o0, o1).0);
                if !hm.geo.in_window(home, bk) {
                    add("an item outside its window", a, o0, o1, None);
                }
            }
            // A value half with a zero hash: still an empty slot.
            add(
                "zero hash, stray value word",
                a,
                0,
                0x0000_0000_dead_beef,
                None,
            );
        }
    }
    for (a, w0, w1) in &live {
        let k = key_of(*w0, *w1);
        if a.id.prefix != 0 {
            // The torn insert of this item: word 1 written, word 0 not.
            add("half-zeroed item (word 0 lost)", a, 0, *w1, Some(k));
        } else {
            // In the prefix-0 segment the special-case write's middle state.
            add(
                "invalidated word 0 + new word 1",
                a,
                a.id.invalid_hi() << 32,
                *w1,
                Some(k),
            );
        }
        // Mixed with the word 0 of an item of a segment of the other half
        // of the table: owned by neither.
        if let Some((_, o0, _)) = live
            .iter()
            .find(|(b, _, _)| (b.id.prefix ^ a.id.prefix) & 0x8000_0000 != 0)
        {
            add("other half's word 0 + this word 1", a, *o0, *w1, Some(k));
        }
    }
    for (what, n) in &count {
        assert!(*n > 0, "no case of {what}");
    }
    assert!(count.len() >= 7, "cases: {count:?}");
    for (what, t, may_lose) in cases {
        let mut allowed = exact(&model);
        if let Some(k) = may_lose {
            allowed.get_mut(&k).unwrap().push(None);
        }
        check_image(t, d, &allowed).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Insert,
    Update,
    Remove,
    Sync,
}

/// Every slot write of a mixed workload (inserts, same-line, cross-line
/// and in-place updates, removes, displacements, splits, merges), torn.
///
/// Checkpoints: the live image before the operation, at each of its
/// fences (from a fence hook) and after it. Between two checkpoints the
/// stores are in program order; a slot written in that interval (a valid
/// item that is not a split's or merge's copy into a segment the
/// operation made) is torn as its stores can leave it: (old word 0, new
/// word 1), or, where that would read as a valid item, the special-case
/// write's (invalid word 0, old word 1) and (invalid word 0, new word 1),
/// over the earlier checkpoint (every later store of the interval, such as
/// the kill of an update's old copy, not done). With such a kill, also the
/// state with the new copy whole and the old one alive: two copies.
/// The engine must make the special-case write exactly as often as the
/// layout's validity rule says it is needed, and every torn state must
/// recover to the key's old or new value, everything else intact.
fn torn_writes_of_a_workload(d: Durability, seed: u64) {
    let (pool, hm) = fresh(d, HashKind::Mixed, 10 + seed);
    let checkpoints = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    {
        let cps = checkpoints.clone();
        pool.set_fence_hook(Some(Box::new(move |_, site| {
            cps.lock().unwrap().push(site.image(CrashChoice::Newest));
        })))
        .unwrap();
    }
    let mut rng = Rng(seed);
    let mut keys = vec![0, u64::MAX, 1, u64::MAX - 1];
    while keys.len() < 300 {
        keys.push(rng.next());
    }
    let mut model: HashMap<u64, u64> = HashMap::new();
    let (mut torn, mut specials, mut dups, mut skipped) = (0u64, 0u64, 0u64, 0u64);
    let mut prev = pool.image();
    let ops = 1500u64;
    for i in 0..ops {
        let key = keys[(rng.next() % keys.len() as u64) as usize];
        let value = rng.next();
        let r = rng.next() % 100;
        let kind = match i * 10 / ops {
            0..=3 => match r {
                0..=74 => Kind::Insert,
                75..=89 => Kind::Update,
                90..=97 => Kind::Remove,
                _ => Kind::Sync,
            },
            4..=5 => match r {
                0..=34 => Kind::Insert,
                35..=64 => Kind::Update,
                65..=97 => Kind::Remove,
                _ => Kind::Sync,
            },
            _ => match r {
                0..=84 => Kind::Remove,
                85..=89 => Kind::Insert,
                90..=97 => Kind::Update,
                _ => Kind::Sync,
            },
        };
        let segs_before: HashSet<u64> = hm.segments().unwrap().iter().map(|(s, _)| *s).collect();
        let mut items_before: HashSet<(u64, u64)> = HashSet::new();
        for a in all_slots(&hm) {
            let w = a.words(&pool);
            if hm.valid(a.id, w.0, w.1, a.bucket) {
                items_before.insert(w);
            }
        }
        let special0 = tally(&hm.t.special_writes);
        checkpoints.lock().unwrap().clear();
        let old = model.get(&key).copied();
        let new = match kind {
            Kind::Insert => {
                assert_eq!(hm.insert(key, value).unwrap(), old.is_none());
                old.or(Some(value))
            }
            Kind::Update => {
                assert_eq!(hm.update(key, value).unwrap(), old.is_some());
                old.map(|_| value)
            }
            Kind::Remove => {
                assert_eq!(hm.remove(key).unwrap(), old.is_some());
                None
            }
            Kind::Sync => {
                hm.sync().unwrap();
                old
            }
        };
        let model_before = model.clone();
        match new {
            Some(v) => model.insert(key, v),
            None => model.remove(&key),
        };
        let special = tally(&hm.t.special_writes) - special0;
        let mut cps = vec![std::mem::replace(&mut prev, pool.image())];
        cps.append(&mut checkpoints.lock().unwrap());
        cps.push(prev.clone());
        let slots = all_slots(&hm);
        let mut allowed = exact(&model_before);
        allowed.entry(key).or_default().push(old);
        allowed.get_mut(&key).unwrap().push(new);
        let mut needed = 0;
        for j in 0..cps.len() - 1 {
            let (a, b) = (&cps[j], &cps[j + 1]);
            let mut writes = Vec::new();
            let (mut kills, mut fresh_kills) = (0, 0);
            for at in &slots {
                let o = (get(a, at.w0()), get(a, at.w0() + 8));
                let n = (get(b, at.w0()), get(b, at.w0() + 8));
                if o == n {
                    continue;
                }
                let fresh_seg = !segs_before.contains(&at.seg);
                if hm.valid(at.id, n.0, n.1, at.bucket) {
                    if !(fresh_seg && items_before.contains(&n)) {
                        writes.push((*at, o, n));
                    }
                } else if fresh_seg {
                    fresh_kills += 1;
                } else {
                    kills += 1;
                }
            }
            for (at, o, n) in &writes {
                if o.0 != n.0 && o.1 != n.1 && valid_by_layout(&hm.geo, at.id, o.0, n.1, at.bucket)
                {
                    needed += 1;
                }
            }
            if writes.len() != 1 || fresh_kills > 0 {
                skipped += writes.len() as u64;
                continue;
            }
            let (at, o, n) = writes[0];
            let mut states = Vec::new();
            if o.0 != n.0 && o.1 != n.1 {
                if valid_by_layout(&hm.geo, at.id, o.0, n.1, at.bucket) {
                    let inv = at.id.invalid_hi() << 32;
                    states.push((inv, o.1, false));
                    states.push((inv, n.1, false));
                } else {
                    states.push((o.0, n.1, false));
                }
            }
            if kills > 0 {
                states.push((n.0, n.1, true));
            }
            for (w0, w1, dup) in states {
                let mut t = a.clone();
                put_slot(&mut t, &at, w0, w1);
                let det = check_image(t, d, &allowed).unwrap_or_else(|e| {
                    panic!(
                        "op {i} {kind:?} key {key:#x}, checkpoint {j}: slot {:#x}/{} ({w0:#x}, {w1:#x}) over ({:#x}, {:#x}): {e}",
                        at.line, at.s, o.0, o.1
                    )
                });
                if dup {
                    assert_eq!(det.duplicates_removed, 1, "op {i}: two copies");
                    dups += 1;
                }
                torn += 1;
            }
        }
        assert_eq!(
            special, needed,
            "op {i} {kind:?} key {key:#x}: {special} special-case writes, the layout rule says {needed} were needed"
        );
        specials += special;
    }
    pool.set_fence_hook(None).unwrap();
    eprintln!(
        "{} seed {seed}: {torn} torn states, {specials} special-case writes, {dups} two-copy states, {skipped} writes skipped; {:?}",
        d.name(),
        hm.stats().detail
    );
    assert!(torn > 500, "only {torn} torn states");
    assert!(skipped * 10 < torn, "{skipped} writes skipped of {torn}");
    assert!(specials > 10, "only {specials} special-case writes");
    assert!(dups > 10, "only {dups} two-copy states");
    assert!(hm.tallies().splits > 0 && hm.tallies().merges > 0);
    assert!(hm.tallies().same_line_updates > 0 && hm.tallies().cross_line_updates > 0);
}

#[test]
fn torn_slot_writes_strict() {
    torn_writes_of_a_workload(Durability::Strict, 1);
}

#[test]
fn torn_slot_writes_relaxed() {
    torn_writes_of_a_workload(Durability::Relaxed, 2);
}

// ----- two copies of a key ---------------------------------------------------------

/// A crash in an out-of-place update can leave the new copy and the old
/// one both valid. Crafted: a second valid copy of a key with another
/// value in a free slot of the same line, of another line of its window,
/// of the stash, and two extra copies at once. Recovery keeps exactly
/// one copy, with one of the values, and counts what it removed.
#[test]
fn two_valid_copies_recover_to_one() {
    let d = Durability::Strict;
    let (pool, hm) = fresh(d, HashKind::Mixed, 3);
    let mut rng = Rng(3);
    let mut model = HashMap::new();
    while model.len() < 250 {
        let (k, v) = (rng.next(), rng.next());
        assert!(hm.insert(k, v).unwrap());
        model.insert(k, v);
    }
    let img = pool.crash_image(CrashChoice::Persisted).unwrap();
    let free = |a: &At| {
        let (w0, w1) = a.words(&pool);
        !hm.valid(a.id, w0, w1, a.bucket)
    };
    let slots = all_slots(&hm);
    let mut done = HashMap::<&str, u64>::new();
    let mut keys: Vec<u64> = model.keys().copied().collect();
    keys.sort_unstable();
    for k in keys {
        let at = slot_of(&hm, k).unwrap();
        if at.bucket.is_none() {
            continue;
        }
        let h = hm.hasher.hash(k);
        let same_line = slots
            .iter()
            .find(|x| x.line == at.line && x.s != at.s && free(x));
        let other_line = slots.iter().find(|x| {
            x.seg == at.seg
                && x.line != at.line
                && x.bucket
                    .is_some_and(|xb| hm.geo.in_window(hm.geo.home(h), xb))
                && free(x)
        });
        let stash: Vec<&At> = slots
            .iter()
            .filter(|x| {
                x.seg == at.seg && x.bucket.is_none() && x.line < at.seg + SEG_BYTES && free(x)
            })
            .collect();
        let mut plans: Vec<(&str, Vec<At>)> = Vec::new();
        if let Some(x) = same_line {
            plans.push(("same line", vec![*x]));
        }
        if let Some(x) = other_line {
            plans.push(("another line of the window", vec![*x]));
        }
        if let Some(x) = stash.first() {
            plans.push(("stash", vec![**x]));
        }
        if let (Some(x), Some(y)) = (same_line, stash.first()) {
            plans.push(("same line and stash", vec![*x, **y]));
        }
        for (what, extra) in plans {
            if done.get(what).copied().unwrap_or(0) >= 3 {
                continue;
            }
            *done.entry(what).or_default() += 1;
            let mut t = img.clone();
            let mut values = vec![Some(model[&k])];
            for (j, x) in extra.iter().enumerate() {
                let v2 = model[&k] ^ (0x1111_0000_0000_1111 * (j as u64 + 1));
                let (w0, w1) = encode_slot(h, v2);
                assert!(
                    hm.valid(x.id, w0, w1, x.bucket),
                    "{what}: the copy must be valid there"
                );
                put_slot(&mut t, x, w0, w1);
                values.push(Some(v2));
            }
            let mut allowed = exact(&model);
            allowed.insert(k, values);
            let det = check_image(t, d, &allowed)
                .unwrap_or_else(|e| panic!("key {k:#x}, copy in the {what}: {e}"));
            assert_eq!(
                det.duplicates_removed,
                extra.len() as u64,
                "key {k:#x}, copy in the {what}"
            );
        }
        if done.len() == 4 && done.values().all(|n| *n >= 3) {
            break;
        }
    }
    assert_eq!(done.len(), 4, "not every placement was tried: {done:?}");
}

// ----- crash windows of splits and merges ------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Op {
    Ins(u64, u64),
    Rem(u64),
    Sync,
}

fn run_op(hm: &Hmeh, op: Op) {
    match op {
        Op::Ins(k, v) => assert!(hm.insert(k, v).unwrap(), "insert {k:#x}"),
        Op::Rem(k) => assert!(hm.remove(k).unwrap(), "remove {k:#x}"),
        Op::Sync => hm.sync().unwrap(),
    }
}

/// What a key may hold: its value now, and (relaxed) every state since
/// the last sync.
#[derive(Clone, Default)]
struct Model {
    cur: HashMap<u64, u64>,
    since_sync: HashMap<u64, Vec<Option<u64>>>,
}

impl Model {
    fn apply(&mut self, op: Op) {
        match op {
            Op::Ins(k, v) => {
                self.since_sync
                    .entry(k)
                    .or_insert_with(|| vec![None])
                    .push(Some(v));
                self.cur.insert(k, v);
            }
            Op::Rem(k) => {
                let b = self.cur.remove(&k);
                self.since_sync
                    .entry(k)
                    .or_insert_with(|| vec![b])
                    .push(None);
            }
            Op::Sync => self.since_sync.clear(),
        }
    }

    fn allowed(&self, d: Durability, in_flight: Option<Op>) -> Allowed {
        let mut a = exact(&self.cur);
        if d == Durability::Relaxed {
            for (k, h) in &self.since_sync {
                a.entry(*k).or_default().extend(h.iter().copied());
            }
        }
        match in_flight {
            Some(Op::Ins(k, v)) => a.entry(k).or_insert_with(|| vec![None]).push(Some(v)),
            Some(Op::Rem(k)) => a.entry(k).or_default().push(None),
            _ => {}
        }
        a
    }
}

/// Structural counters of one operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Deltas {
    splits: u64,
    node_splits: u64,
    delayed: u64,
    backups: u64,
    merges: u64,
}

fn counters(hm: &Hmeh) -> Deltas {
    let t = &hm.t;
    Deltas {
        splits: t.splits.load(Ordering::Relaxed),
        node_splits: t.node_splits.load(Ordering::Relaxed),
        delayed: t.delayed_splits.load(Ordering::Relaxed),
        backups: t.backups_made.load(Ordering::Relaxed),
        merges: t.merges.load(Ordering::Relaxed),
    }
}

fn minus(a: Deltas, b: Deltas) -> Deltas {
    Deltas {
        splits: a.splits - b.splits,
        node_splits: a.node_splits - b.node_splits,
        delayed: a.delayed - b.delayed,
        backups: a.backups - b.backups,
        merges: a.merges - b.merges,
    }
}

/// The structural counters of every operation of `ops` on a fresh table.
fn trace(d: Durability, tag: u64, ops: &[Op]) -> Vec<Deltas> {
    let (_pool, hm) = fresh(d, HashKind::Mixed, tag);
    ops.iter()
        .map(|op| {
            let c = counters(&hm);
            run_op(&hm, *op);
            minus(counters(&hm), c)
        })
        .collect()
}

fn rt_nodes(hm: &Hmeh) -> HashSet<u64> {
    let mut set = HashSet::new();
    rt::walk(
        &hm.pool,
        hm.rt_root,
        |n, _| {
            set.insert(n);
            Ok(())
        },
        |_| Ok(()),
    )
    .unwrap();
    set
}

/// Replays `ops[..target]`, then runs `ops[target]` with a crash image
/// taken at every one of its fences (persisted, newest, two random; each
/// recently written line alone written back and alone lost; every prefix
/// of the stores to an RT node line) and after it; each is recovered and
/// checked. Returns the operation's counters and the states checked.
fn crash_every_fence(d: Durability, tag: u64, ops: &[Op], target: usize) -> (Deltas, u64) {
    let (pool, hm) = fresh(d, HashKind::Mixed, tag);
    let mut model = Model::default();
    for op in &ops[..target] {
        run_op(&hm, *op);
        model.apply(*op);
    }
    let nodes = rt_nodes(&hm);
    let allowed = model.allowed(d, Some(ops[target]));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let states = Arc::new(AtomicU64::new(0));
    {
        let (errors, states) = (errors.clone(), states.clone());
        pool.set_fence_hook(Some(Box::new(move |fence, site| {
            let mut images: Vec<(String, Vec<u8>)> = Vec::new();
            let recent = site.recent_lines();
            let mut choices = vec![
                CrashChoice::Persisted,
                CrashChoice::Newest,
                CrashChoice::Random(fence),
                CrashChoice::Random(fence ^ 0x5555),
            ];
            for &l in recent.iter().take(8) {
                choices.push(CrashChoice::OnlyNew(l));
                choices.push(CrashChoice::AllButOld(l));
            }
            for c in choices {
                images.push((format!("{c:?}"), site.image(c)));
            }
            let old = site.image(CrashChoice::Persisted);
            let new = site.image(CrashChoice::Newest);
            for &l in &recent {
                if !nodes.contains(&(l * LINE)) {
                    continue;
                }
                let changed: Vec<u64> = (0..8)
                    .map(|i| l * LINE + i * 8)
                    .filter(|&o| get(&old, o) != get(&new, o))
                    .collect();
                for j in 1..changed.len() {
                    let mut t = old.clone();
                    for &o in &changed[..j] {
                        put(&mut t, o, get(&new, o));
                    }
                    images.push((
                        format!("RT node {:#x}: {j} of {} entries", l * LINE, changed.len()),
                        t,
                    ));
                }
            }
            for (what, img) in images {
                states.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = check_image(img, d, &allowed) {
                    errors
                        .lock()
                        .unwrap()
                        .push(format!("fence {fence} {what}: {e}"));
                }
            }
        })))
        .unwrap();
    }
    let c = counters(&hm);
    run_op(&hm, ops[target]);
    pool.set_fence_hook(None).unwrap();
    let delta = minus(counters(&hm), c);
    model.apply(ops[target]);
    let after = model.allowed(d, None);
    for c in [
        CrashChoice::Persisted,
        CrashChoice::Newest,
        CrashChoice::Random(7),
    ] {
        states.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = check_image(pool.crash_image(c).unwrap(), d, &after) {
            errors
                .lock()
                .unwrap()
                .push(format!("after the operation, {c:?}: {e}"));
        }
    }
    let errors = errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "{} op {target} {:?} ({delta:?}): {} bad crash states of {}:\n{}",
        d.name(),
        ops[target],
        errors.len(),
        states.load(Ordering::Relaxed),
        errors
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    (delta, states.load(Ordering::Relaxed))
}

fn inserts(seed: u64, n: usize) -> Vec<Op> {
    let mut rng = Rng(seed);
    (0..n).map(|_| Op::Ins(rng.next(), rng.next())).collect()
}

/// The first `n` operations of the trace after index `from` matching `pred`.
fn pick(tr: &[Deltas], from: usize, n: usize, pred: impl Fn(&Deltas) -> bool) -> Vec<usize> {
    (from..tr.len()).filter(|&i| pred(&tr[i])).take(n).collect()
}

/// `ops` with a sync inserted before index `at`.
fn sync_before(ops: &[Op], at: usize) -> Vec<Op> {
    let mut v = ops[..at].to_vec();
    v.push(Op::Sync);
    v.extend_from_slice(&ops[at..]);
    v
}

/// Strict: splits inside an RT node and node-creating splits (Fig. 7):
/// a crash at any fence recovers every earlier key, the key in flight
/// all or nothing, no leak, and a table that takes new keys.
#[test]
fn split_crash_windows_strict() {
    let d = Durability::Strict;
    let tag = 20;
    let ops = inserts(20, 700);
    let tr = trace(d, tag, &ops);
    let intra = pick(&tr, 0, 3, |t| t.splits > 0 && t.node_splits == 0);
    let node = pick(&tr, 0, 3, |t| t.node_splits > 0);
    assert!(
        intra.len() == 3 && node.len() == 3,
        "intra {intra:?}, node {node:?}"
    );
    let mut total = 0;
    for &t in intra.iter().chain(&node) {
        let (delta, n) = crash_every_fence(d, tag, &ops, t);
        assert_eq!(delta, tr[t], "the replay split differently");
        assert_eq!(delta.backups, 0);
        total += n;
    }
    eprintln!("strict splits: {total} crash states");
}

/// Relaxed: a sync just before the split, so every earlier key must
/// survive; splits inside a node, the backup variant at a new node, and
/// the delayed split inside a node whose backup is live (synced before
/// the node split that made the backup).
#[test]
fn split_crash_windows_relaxed() {
    let d = Durability::Relaxed;
    let tag = 21;
    let ops = inserts(21, 900);
    let tr = trace(d, tag, &ops);
    let mut total = 0;
    let intra = pick(&tr, 0, 2, |t| {
        t.splits > 0 && t.node_splits == 0 && t.delayed == 0
    });
    let node = pick(&tr, 0, 2, |t| t.backups > 0);
    assert!(
        intra.len() == 2 && node.len() == 2,
        "intra {intra:?}, node {node:?}"
    );
    for &t in intra.iter().chain(&node) {
        let ops2 = sync_before(&ops, t);
        let (delta, n) = crash_every_fence(d, tag, &ops2, t + 1);
        assert_eq!(delta, tr[t], "the replay split differently");
        total += n;
    }
    // Delayed: a sync before a backup split, and a split inside that
    // node before the next sync.
    let (ops2, t2) = tr
        .iter()
        .enumerate()
        .filter(|(_, t)| t.backups > 0)
        .find_map(|(b, _)| {
            let ops2 = sync_before(&ops, b);
            let tr2 = trace(d, tag, &ops2);
            pick(&tr2, b + 1, 1, |t| t.delayed > 0)
                .first()
                .map(|&t| (ops2, t))
        })
        .expect("no delayed split after any synced backup split");
    let (delta, n) = crash_every_fence(d, tag, &ops2, t2);
    assert!(delta.delayed > 0);
    total += n;
    eprintln!("relaxed splits: {total} crash states");
}

/// Merges (both durabilities): grow, then remove until buddies merge; a
/// crash at any fence of the merging remove.
#[test]
fn merge_crash_windows() {
    for (d, tag) in [(Durability::Strict, 22u64), (Durability::Relaxed, 23)] {
        let mut ops = inserts(tag, 500);
        let mut rng = Rng(tag);
        let mut keys: Vec<u64> = ops
            .iter()
            .map(|o| match o {
                Op::Ins(k, _) => *k,
                _ => unreachable!(),
            })
            .collect();
        for i in (1..keys.len()).rev() {
            keys.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        // A sync drops the backups (relaxed), which keep segments from
        // merging.
        ops.push(Op::Sync);
        ops.extend(keys.iter().map(|k| Op::Rem(*k)));
        let tr = trace(d, tag, &ops);
        let merges = pick(&tr, 501, 3, |t| t.merges > 0);
        assert_eq!(merges.len(), 3, "{}: merges at {merges:?}", d.name());
        let mut total = 0;
        for &t in &merges {
            let (ops2, t2) = if d == Durability::Relaxed {
                (sync_before(&ops, t), t + 1)
            } else {
                (ops.clone(), t)
            };
            let (delta, n) = crash_every_fence(d, tag, &ops2, t2);
            assert!(delta.merges > 0, "the replay did not merge");
            total += n;
        }
        eprintln!("{} merges: {total} crash states", d.name());
    }
}

// ----- backups ---------------------------------------------------------------------

/// Relaxed: after a sync, more keys (not synced), then a node-creating
/// split makes a backup of the old segment. A crash right after with only
/// fenced data durable loses the new segments' lines; recovery must
/// restore every item of the old segment from the backup ("backup items
/// merged"), keep every synced key, invent nothing, and drop the backup.
#[test]
fn backup_restores_the_lost_new_segments() {
    let d = Durability::Relaxed;
    let (pool, hm) = fresh(d, HashKind::Mixed, 30);
    let mut rng = Rng(30);
    let mut model = Model::default();
    for _ in 0..80 {
        let op = Op::Ins(rng.next(), rng.next());
        run_op(&hm, op);
        model.apply(op);
    }
    hm.sync().unwrap();
    model.apply(Op::Sync);
    let mut synced = model.cur.clone();
    let mut made = 0;
    let mut restored_unsynced = 0;
    for _ in 0..5000 {
        let (k, v) = (rng.next(), rng.next());
        let h = hm.hasher.hash(k);
        let (seg, id) = hm
            .segments()
            .unwrap()
            .into_iter()
            .find(|(_, id)| id.owns(h))
            .unwrap();
        let mut held = Vec::new();
        hm.each_valid(seg, id, &mut |h, w0, w1| {
            held.push((hm.hasher.key(h), decode_slot(w0, w1).1))
        });
        let b0 = hm.tallies().backups_made;
        run_op(&hm, Op::Ins(k, v));
        model.apply(Op::Ins(k, v));
        if hm.tallies().backups_made == b0 {
            continue;
        }
        made += 1;
        // The split segment's items, some inserted since the sync: all in
        // the flushed backup.
        let unsynced = held.iter().filter(|(k, _)| !synced.contains_key(k)).count();
        let allowed = model.allowed(d, None);
        let mut must = allowed.clone();
        for (k, v) in &held {
            must.insert(*k, vec![Some(*v)]);
        }
        let det = check_image(pool.crash_image(CrashChoice::Persisted).unwrap(), d, &must)
            .unwrap_or_else(|e| panic!("backup {made}, persisted image: {e}"));
        let merged = det.backups_merged;
        assert_eq!(
            merged,
            held.len() as u64,
            "backup {made}: the new segments' lines were lost, so every item of the backup ({} of them, {unsynced} since the sync) is merged",
            held.len()
        );
        let det = check_image(
            pool.crash_image(CrashChoice::Newest).unwrap(),
            d,
            &exact(&model.cur),
        )
        .unwrap_or_else(|e| panic!("backup {made}, newest image: {e}"));
        assert_eq!(det.backups_merged, 0, "nothing was lost");
        restored_unsynced += unsynced;
        if made == 3 {
            break;
        }
        // The next round starts from a sync (which drops this backup).
        hm.sync().unwrap();
        model.apply(Op::Sync);
        synced = model.cur.clone();
    }
    assert_eq!(made, 3, "fewer than three backups made");
    assert!(
        restored_unsynced > 0,
        "no backup held an item written since the last sync"
    );
}

/// Relaxed: a node-creating split copies the old segment's items into two
/// new segments without flushing them (the backup covers them). The
/// copies are two stores each, word 1 then word 0, into zeroed slots:
/// within the line a crash can leave (0, word 1), the very state the
/// special-case write exists to avoid. When the split segment has prefix
/// 0, its lower half has prefix 0 too, and (0, word 1) reads there as a
/// valid item with hash = the item's low word: a phantom key that
/// recovery keeps (the backup merge only adds missing keys).
#[test]
fn delayed_split_copies_need_the_special_case_write() {
    let d = Durability::Relaxed;
    let (pool, hm) = fresh(d, HashKind::Mixed, 31);
    let mut rng = Rng(31);
    let mut model = Model::default();
    hm.sync().unwrap();
    for _ in 0..5000 {
        let (k, v) = (rng.next(), rng.next());
        let h = hm.hasher.hash(k);
        let owner = hm
            .segments()
            .unwrap()
            .into_iter()
            .find(|(_, id)| id.owns(h))
            .unwrap();
        let b0 = hm.tallies().backups_made;
        run_op(&hm, Op::Ins(k, v));
        model.apply(Op::Ins(k, v));
        if hm.tallies().backups_made == b0 || owner.1.prefix != 0 {
            continue;
        }
        // The prefix-0 segment split at a new node: its lower half has prefix 0.
        let (lo_seg, lo_id) = hm
            .segments()
            .unwrap()
            .into_iter()
            .find(|(_, id)| id.prefix == 0)
            .unwrap();
        assert_eq!(lo_id.ld, owner.1.ld + 1);
        assert_eq!(
            pool.load_u64(lo_seg + H_BACKUP),
            owner.0,
            "the old segment is the backup"
        );
        // An item copied there (not the key just inserted).
        let mut copy = None;
        hm.each_slot(lo_seg, &mut |line, s, bucket, _| {
            let w = hm.pool.words(line, 8);
            let (w0, w1) = (
                w[2 * s].load(Ordering::Relaxed),
                w[2 * s + 1].load(Ordering::Relaxed),
            );
            if copy.is_none()
                && hm.valid(lo_id, w0, w1, bucket)
                && hm.hasher.key(decode_slot(w0, w1).0) != k
            {
                copy = Some((
                    At {
                        seg: lo_seg,
                        id: lo_id,
                        line,
                        s,
                        bucket,
                    },
                    w0,
                    w1,
                ));
            }
        });
        let (at, _w0, w1) = copy.expect("the lower half holds a copied item");
        // The new segments were not flushed: their buckets are zero in the
        // persisted image. The copy's word 1 reached PM, its word 0 did
        // not. Where (0, word 1) would read as an item, the engine stores an
        // invalid word 0 first (same line, so it is durable before word 1):
        // the torn state it can leave is then (invalid, word 1).
        let mut img = pool.crash_image(CrashChoice::Persisted).unwrap();
        assert_eq!((get(&img, at.w0()), get(&img, at.w0() + 8)), (0, 0));
        let torn0 = if hm.valid(lo_id, 0, w1, at.bucket) {
            assert!(
                hm.tallies().special_case_writes > 0,
                "(0, word 1) is valid here, so the copy needed a special-case write"
            );
            lo_id.invalid_hi() << 32
        } else {
            0
        };
        put_slot(&mut img, &at, torn0, w1);
        let allowed = model.allowed(d, None);
        if let Err(e) = check_image(img, d, &allowed) {
            panic!(
                "a torn copy (0, {w1:#x}) in the unflushed prefix-0 half {lo_seg:#x} of a backup split: {e}"
            );
        }
        return;
    }
    panic!("the prefix-0 segment never split at a new node");
}

// ----- regressions -----------------------------------------------------------------

/// Identity hash (hash = key), 4 KiB segments (59 buckets, 4 stash
/// buckets: 252 slots) and an initial capacity of 600 keys: four segments
/// of local depth 2 in the root node.
fn identity_4k(d: Durability) -> (Arc<Pool>, Hmeh) {
    let pool = Arc::new(
        Pool::create(
            Path::new(""),
            &PoolOptions {
                mode: Mode::Simulated,
                size: 4 * MIB,
                max_size: 16 * MIB,
                layout: LAYOUT.into(),
                ..PoolOptions::default()
            },
        )
        .unwrap(),
    );
    let cfg = EngineConfig {
        durability: d,
        initial_capacity: 600,
        threads: 1,
    };
    let opts = Options {
        segment_bytes: Some(4096),
        max_depth: DEFAULT_MAX_DEPTH,
        hash: HashKind::Identity,
        stash_before_split: false,
    };
    let hm = Hmeh::create_with(pool.clone(), &cfg, &opts).unwrap();
    assert_eq!((hm.geo.buckets, hm.geo.stash, hm.geo.slots()), (59, 4, 252));
    (pool, hm)
}

/// A merge whose items do not fit: buddies 00 and 01 (local depth 2) hold
/// 20 keys each, 16 of home bucket 0 (its window, buckets 0..3, full) and
/// 4 of home bucket 1 (in bucket 4). After one remove (39 items, within
/// the 252/4 = 63 a merge tries) the merged segment offers those homes
/// buckets 0..4 and the stash, 36 slots: the merge fails. It must give back
/// its new segment M unlocked: before the fix M was cancelled with its
/// lock held, and the next `init_segment` of that block (the next merge
/// attempt, or a split) spun forever. Here the block M used is the next
/// one a 4 KiB reservation gets: its lock word moved (the attempt
/// happened, and wrote M's identity) and is free; a split then takes that
/// block; once the buddies hold 36 items they merge.
#[test]
fn failed_merge_unlocks_and_gives_back_its_new_segment() {
    let (pool, hm) = identity_4k(Durability::Strict);
    // Low words of home bucket 0 and 1: home = low * 59 >> 32.
    let key = |top: u64, i: u64, low: u64| ((top << 30 | i) << 32) | low;
    let low1 = (1u64 << 32).div_ceil(59);
    let a: Vec<u64> = (1..=16).map(|i| key(0, i, 7)).collect();
    let b: Vec<u64> = (1..=16).map(|i| key(1, i, 7)).collect();
    let a1: Vec<u64> = (17..=20).map(|i| key(0, i, low1)).collect();
    let b1: Vec<u64> = (17..=20).map(|i| key(1, i, low1)).collect();
    let mut model = HashMap::new();
    for &k in a.iter().chain(&b).chain(&a1).chain(&b1) {
        assert_eq!(hm.geo.home(k), u64::from(k & 0xffff_ffff != 7));
        assert!(hm.insert(k, k ^ 0xff).unwrap());
        model.insert(k, k ^ 0xff);
    }
    let segs = hm.segments().unwrap();
    assert_eq!(segs.len(), 4);
    let seg_of = |prefix: u32| segs.iter().find(|(_, id)| id.prefix == prefix).unwrap().0;
    let (sa, sb) = (seg_of(0), seg_of(0x4000_0000));
    assert_eq!(hm.head(sa)[HD_COUNT].load(Ordering::Relaxed), 20);
    assert_eq!(hm.head(sb)[HD_COUNT].load(Ordering::Relaxed), 20);
    assert_eq!(tally(&hm.t.splits), 0);
    // The block the merge will reserve.
    let probe = pool.reserve(4096, Link::Nothing).unwrap();
    let m = probe.offset();
    let before = hm.head(m)[HD_LOCK].load(Ordering::Relaxed);
    pool.cancel(probe);
    let in_use = pool.stats().bytes_in_use;

    assert!(hm.remove(a[0]).unwrap());
    model.remove(&a[0]);
    assert_eq!(tally(&hm.t.merges), 0, "39 items in 36 slots cannot merge");
    assert_eq!(
        hm.segments().unwrap(),
        segs,
        "a failed merge changes nothing"
    );
    assert_eq!(pool.stats().bytes_in_use, in_use, "M was given back");
    for s in [sa, sb] {
        assert!(
            hm.lock.is_free(hm.head(s)[HD_LOCK].load(Ordering::Relaxed)),
            "buddy {s:#x} left locked"
        );
    }
    let r = pool.reserve(4096, Link::Nothing).unwrap();
    assert_eq!(
        r.offset(),
        m,
        "the next 4 KiB block is the failed merge's M"
    );
    let w = hm.head(m)[HD_LOCK].load(Ordering::Relaxed);
    assert_ne!(w, before, "no merge was attempted (M's lock never taken)");
    assert_eq!(
        pool.load_u64(m + H_IDENT),
        Ident { ld: 1, prefix: 0 }.encode(),
        "M holds the merged identity"
    );
    assert!(hm.lock.is_free(w), "the failed merge left M locked");
    let lw = &hm.head(m)[HD_LOCK];
    assert!(hm.lock.try_lock(lw), "M's lock cannot be taken again");
    hm.lock.unlock(lw);
    pool.cancel(r);

    // A split reuses the block (its init_segment takes M's lock).
    let kc = 2u64 << 62 | 5;
    let (seg, id, _) = hm.lock_owner(kc);
    hm.split(seg, id).unwrap();
    assert_eq!(tally(&hm.t.splits), 1);
    assert!(
        hm.segments().unwrap().iter().any(|(s, _)| *s == m),
        "the split's new segment is the block M had"
    );
    // More failed attempts (38 and 37 items), then the merge at 36.
    for (j, k) in a[1..4].iter().enumerate() {
        assert!(hm.remove(*k).unwrap());
        model.remove(k);
        let want = if j == 2 { 1 } else { 0 };
        assert_eq!(tally(&hm.t.merges), want, "after {} removes", j + 2);
    }
    assert_eq!(contents(&hm).unwrap(), model);
    let rep = hm.check().unwrap();
    assert_eq!(rep.keys, model.len() as u64);
    assert_eq!(rep.reachable_bytes, pool.stats().bytes_in_use, "leak");
}

/// A cleanly closed pool whose live segments carry a nonzero retired word
/// in PM (DRAM meaning; a live segment is never retired): the open never
/// reads it (the heads start with the flag clear), so `lock_owner` (which waits for a segment that is not retired)
/// returns and writers of those keys get through. Before the fix the
/// flag stayed and every writer spun forever.
#[test]
fn clean_open_clears_retired_words() {
    // The PM header's retired word (written 0; the flag lives in the head).
    const H_RETIRED: u64 = 48;
    let d = Durability::Strict;
    let (pool, hm) = fresh(d, HashKind::Mixed, 40);
    let mut rng = Rng(40);
    let mut model = HashMap::new();
    while model.len() < 300 {
        let (k, v) = (rng.next(), rng.next());
        assert!(hm.insert(k, v).unwrap());
        model.insert(k, v);
    }
    let segs = hm.segments().unwrap();
    hm.close().unwrap();
    let mut img = pool.crash_image(CrashChoice::Persisted).unwrap();
    for (i, (s, _)) in segs.iter().enumerate() {
        put(
            &mut img,
            s + H_RETIRED,
            if i % 2 == 0 { 1 } else { u64::MAX },
        );
    }
    let p2 = Arc::new(Pool::from_image(img, Mode::Simulated).unwrap());
    assert!(p2.was_clean());
    let h2 = Hmeh::open(p2.clone(), &ecfg(d)).unwrap();
    for (s, _) in h2.segments().unwrap() {
        assert_eq!(
            h2.head(s)[HD_RETIRED].load(Ordering::Relaxed),
            0,
            "segment {s:#x} still retired"
        );
    }
    // Every key's owner can be locked (a retired flag would loop forever).
    for k in model.keys() {
        let (seg, id, _) = h2.lock_owner(h2.hasher.hash(*k));
        assert!(id.owns(h2.hasher.hash(*k)));
        h2.unlock(seg);
    }
    for (i, (k, v)) in model.iter().enumerate() {
        if i % 2 == 0 {
            assert!(h2.update(*k, !*v).unwrap());
        } else {
            assert!(h2.remove(*k).unwrap());
        }
    }
    h2.check().unwrap();
}

/// A strict table on a volatile pool, sized for 1,024 keys, that grows
/// as it is filled (to at most 512 MiB).
fn growing_volatile() -> Hmeh {
    let pool = Arc::new(
        Pool::create(
            Path::new(""),
            &PoolOptions {
                mode: Mode::Volatile,
                size: 16 * MIB,
                max_size: 512 * MIB,
                layout: LAYOUT.into(),
                ..PoolOptions::default()
            },
        )
        .unwrap(),
    );
    let mut cfg = ecfg(Durability::Strict);
    cfg.initial_capacity = 1024;
    Hmeh::create(pool, &cfg).unwrap()
}

/// A negative lookup reads past its home bucket only where the home's
/// spill planes say an item of it may sit there (`head::Spill::reach`).
/// After a table grows from empty to 300K keys, most homes must read one
/// bucket and every item must be within its home's reach. Before the
/// per-home planes and the compacting split, one spill bit stood for
/// ~4 homes and splits kept every item's position: about 5% of homes
/// read one bucket.
#[test]
fn most_homes_of_a_grown_table_read_one_bucket() {
    let hm = growing_volatile();
    let mut rng = Rng(5);
    for _ in 0..300_000 {
        hm.insert(rng.next(), 1).unwrap();
    }
    let (mut reach1, mut homes, mut items, mut outside) = (0u64, 0u64, 0u64, 0u64);
    for (s, id) in hm.segments().unwrap() {
        let (spill, _) = hm.search_bits(s);
        for home in 0..hm.geo.buckets {
            reach1 += u64::from(spill.reach(home) == 1);
            homes += 1;
        }
        hm.each_slot(s, &mut |line, slot, bucket, _| {
            let w = hm.words(line);
            let (w0, w1) = (
                w[2 * slot].load(Ordering::Relaxed),
                w[2 * slot + 1].load(Ordering::Relaxed),
            );
            if let Some(b) = bucket.filter(|_| hm.valid(id, w0, w1, bucket)) {
                let home = hm.geo.home(decode_slot(w0, w1).0);
                items += 1;
                outside += u64::from(hm.geo.dist(home, b) >= spill.reach(home));
            }
        });
    }
    assert!(items > 290_000, "{items} items in normal buckets");
    assert_eq!(outside, 0, "items beyond their home's reach");
    let share = reach1 as f64 / homes as f64;
    assert!(
        share > 0.6,
        "only {share:.3} of {homes} homes read one bucket"
    );
    hm.check().unwrap();
}

/// A merge refused for where the buddies sit in the RT-directory is not
/// tried again by later deletes in either segment: draining a grown table
/// refuses at most once per segment that ever lived, where trying on every
/// delete into a nearly empty segment refused thousands of times, and the
/// drain still merges.
#[test]
fn a_refused_merge_is_not_tried_again() {
    let hm = growing_volatile();
    let first = hm.tallies().segments;
    let mut rng = Rng(6);
    let keys: Vec<u64> = (0..100_000).map(|_| rng.next()).collect();
    for &k in &keys {
        hm.insert(k, 1).unwrap();
    }
    for &k in &keys {
        assert!(hm.remove(k).unwrap());
    }
    let t = hm.tallies();
    let lived = first + 2 * t.splits + t.merges;
    assert!(t.merges > 0, "the drain merged nothing: {t:?}");
    assert!(t.merge_refusals > 0, "no merge was refused: {t:?}");
    assert!(
        t.merge_refusals <= lived,
        "{} refusals for {lived} segments that lived",
        t.merge_refusals
    );
    assert_eq!(hm.len(), 0);
    hm.check().unwrap();
}

/// A merge refusal is remembered under the identity it was made for: the
/// refused segment skips later attempts, and once it splits (a new
/// identity, a new buddy, a new place in the RT-directory) it tries again.
#[test]
fn a_merge_refusal_ends_when_the_segment_splits() {
    let hm = growing_volatile();
    let mut rng = Rng(7);
    for _ in 0..20_000 {
        hm.insert(rng.next(), 1).unwrap();
    }
    let h = hm.hasher.hash(rng.next());
    let (seg, id, hw) = hm.lock_owner(h);
    hw[HD_NO_MERGE].store(id.encode(), Ordering::Relaxed);
    assert!(Hmeh::merge_refused(hw, id), "refused under its identity");
    hm.split(seg, id).unwrap();
    let now = Ident::decode(hm.head(seg)[HD_IDENT].load(Ordering::Relaxed)).unwrap();
    assert_eq!(now.ld, id.ld + 1, "the segment kept the lower half");
    assert!(
        !Hmeh::merge_refused(hm.head(seg), now),
        "a refusal made under {id:?} holds for {now:?}"
    );
    hm.check().unwrap();
}
