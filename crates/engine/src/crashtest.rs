//! The crash checker.
//!
//! It runs a random workload against an engine in a `simulated` pool, takes
//! crash states at chosen fences (and between operations), recovers each
//! with a fresh engine instance, and checks the result against a model of
//! what the durability contract allows:
//!
//! - `Strict`: every key holds exactly its value after the last completed
//!   operation, except the key of the operation in flight, which holds its
//!   value before or after that operation.
//! - `Relaxed`: every key holds a value it had at some point since the last
//!   `sync` (or the in-flight operation's result).
//!
//! In both modes: no key twice, no invented key or value, no resurrected
//! delete, recovery never fails or panics, `check()` passes, no leaked PM
//! block (allocator bytes in use = bytes reachable from the engine), and the
//! recovered engine accepts a new write.
//!
//! Crash states come from the simulator (`pmem::sim`): the persisted image
//! plus a subset of the lines not yet durable; each chosen site yields the
//! "only durable" state, the "everything written back" state, or a random
//! mix, in turn.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Arc, Mutex};

use pmem::{CrashChoice, Mode, Pool, PoolOptions};

use crate::{Durability, Engine, EngineConfig, EngineKind, EngineSpec, Error, Result};

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Operations in the workload.
    pub ops: u64,
    /// Crash states to check (approximately; the exact count is reported).
    pub states: u64,
    /// Seed of the workload and of the crash-state sampling.
    pub seed: u64,
    /// The durability contract the engine runs under and is checked against.
    pub durability: Durability,
    /// Distinct keys the workload draws from (small, so that updates,
    /// duplicate inserts and deletes of present keys are common).
    pub key_space: u64,
    /// Pool size in bytes; the pool may grow to 4×.
    pub pool_size: u64,
    /// Engine initial capacity (small, so that resizes happen).
    pub initial_capacity: u64,
    /// Stop recording violation messages after this many (all are counted).
    pub max_messages: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ops: 2000,
            states: 2000,
            seed: 1,
            durability: Durability::Strict,
            key_space: 600,
            pool_size: 2 << 20,
            initial_capacity: 16,
            max_messages: 20,
        }
    }
}

/// The result, as printed and written to JSON.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The engine's registry name.
    pub engine: String,
    /// The durability contract checked.
    pub durability: Durability,
    /// The seed the run used.
    pub seed: u64,
    /// Crash states recovered and checked.
    pub states: u64,
    /// Crash states (and final checks) that broke the contract.
    pub violations: u64,
    /// Bytes allocated but unreachable, summed over all states.
    pub leaked_bytes: u64,
    /// Fences the workload issued.
    pub fences: u64,
    /// Operations run.
    pub ops: u64,
    /// The first violations, described.
    pub messages: Vec<String>,
    /// Of `states`, the images taken during a recovery (a crash while
    /// recovering from a crash).
    pub recovery_crashes: u64,
    /// The engine's own figures after the workload (`Stats::detail` of the
    /// dry run): which paths the crash states covered.
    pub detail: Vec<(String, String)>,
}

impl Report {
    /// `{"engine","durability","states","violations","leaked_bytes","seed",...}`
    pub fn to_json(&self) -> String {
        let msgs: Vec<String> = self.messages.iter().map(|m| json_string(m)).collect();
        format!(
            "{{\"engine\":{},\"durability\":\"{}\",\"states\":{},\"violations\":{},\"leaked_bytes\":{},\"seed\":{},\"fences\":{},\"recovery_crashes\":{},\"ops\":{},\"messages\":[{}]}}",
            json_string(&self.engine),
            self.durability.name(),
            self.states,
            self.violations,
            self.leaked_bytes,
            self.seed,
            self.fences,
            self.recovery_crashes,
            self.ops,
            msgs.join(",")
        )
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Insert,
    Update,
    Upsert,
    Remove,
    Get,
    Sync,
}

#[derive(Clone, Copy, Debug)]
struct Op {
    kind: OpKind,
    key: u64,
    value: u64,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn workload(cfg: &Config) -> Vec<Op> {
    let mut rng = Rng(cfg.seed);
    // The key space always holds 0 and u64::MAX: sentinels must not steal keys.
    let mut keys = vec![0, u64::MAX, 1, u64::MAX - 1];
    while (keys.len() as u64) < cfg.key_space.max(4) {
        keys.push(rng.next());
    }
    (0..cfg.ops)
        .map(|i| {
            let key = keys[(rng.next() % keys.len() as u64) as usize];
            // Unique values: a recovered value names the write it came from.
            let value = rng.next() ^ i;
            // Three phases, so that every structure grows, churns and
            // shrinks: insert-heavy (40% of the ops), mixed (20%),
            // remove-heavy (40%).
            let r = rng.next() % 100;
            let phase = i * 10 / cfg.ops.max(1);
            let kind = match phase {
                0..=3 => match r {
                    0..=69 => OpKind::Insert,
                    70..=79 => OpKind::Update,
                    80..=84 => OpKind::Upsert,
                    85..=89 => OpKind::Remove,
                    90..=97 => OpKind::Get,
                    _ => OpKind::Sync,
                },
                4..=5 => match r {
                    0..=34 => OpKind::Insert,
                    35..=54 => OpKind::Update,
                    55..=64 => OpKind::Upsert,
                    65..=84 => OpKind::Remove,
                    85..=96 => OpKind::Get,
                    _ => OpKind::Sync,
                },
                _ => match r {
                    0..=84 => OpKind::Remove,
                    85..=86 => OpKind::Insert,
                    87..=91 => OpKind::Update,
                    92..=97 => OpKind::Get,
                    _ => OpKind::Sync,
                },
            };
            Op { kind, key, value }
        })
        .collect()
}

/// The key's state after `op`, given its state before.
fn apply(before: Option<u64>, op: &Op) -> Option<u64> {
    match op.kind {
        OpKind::Insert => before.or(Some(op.value)),
        OpKind::Update => before.map(|_| op.value),
        OpKind::Upsert => Some(op.value),
        OpKind::Remove => None,
        OpKind::Get | OpKind::Sync => before,
    }
}

/// What a crash state may contain.
#[derive(Default)]
struct Model {
    /// After the last completed operation.
    committed: HashMap<u64, u64>,
    /// Relaxed: every state each key had since the last sync.
    since_sync: HashMap<u64, Vec<Option<u64>>>,
    in_flight: Option<Op>,
}

impl Model {
    fn allowed(&self, durability: Durability, key: u64) -> Vec<Option<u64>> {
        let cur = self.committed.get(&key).copied();
        let mut allowed = match durability {
            Durability::Strict => vec![cur],
            Durability::Relaxed => {
                let mut v = self.since_sync.get(&key).cloned().unwrap_or_default();
                v.push(cur);
                v
            }
        };
        if let Some(op) = self.in_flight.filter(|op| op.key == key) {
            allowed.push(apply(cur, &op));
        }
        allowed
    }

    fn complete(&mut self, op: &Op) {
        let before = self.committed.get(&op.key).copied();
        let after = apply(before, op);
        if op.kind == OpKind::Sync {
            self.since_sync.clear();
        } else if after != before {
            self.since_sync
                .entry(op.key)
                .or_insert_with(|| vec![before])
                .push(after);
        }
        match after {
            Some(v) => self.committed.insert(op.key, v),
            None => self.committed.remove(&op.key),
        };
        self.in_flight = None;
    }
}

struct Checker {
    spec: EngineSpec,
    cfg: Config,
    report: Report,
    /// Images from the workload checked so far.
    checked: u64,
}

fn fmt_val(v: Option<u64>) -> String {
    v.map_or("absent".into(), |v| format!("{v:#x}"))
}

impl Checker {
    fn fail(&mut self, msg: String) {
        self.report.violations += 1;
        if self.report.messages.len() < self.cfg.max_messages {
            self.report.messages.push(msg);
        }
    }

    /// Recovers one crash image and checks it against the model.
    fn check_image(&mut self, image: Vec<u8>, model: &Model, site: &str) {
        self.checked += 1;
        let spec = self.spec;
        let ecfg = engine_config(&self.cfg);
        let durability = self.cfg.durability;
        let max_size = max_pool_size(&self.cfg);
        // Every eighth state also crashes during its own recovery.
        let recrash = self
            .checked
            .is_multiple_of(8)
            .then(|| self.cfg.seed ^ self.checked.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            verify(spec, &ecfg, durability, image, max_size, model, recrash)
        }));
        self.report.states += 1;
        match outcome {
            Ok(Ok((leaked, images))) => {
                self.report.states += images - 1;
                self.report.recovery_crashes += images - 1;
                if leaked != 0 {
                    self.report.leaked_bytes += leaked;
                    self.fail(format!("{site}: {leaked} bytes leaked"));
                }
            }
            Ok(Err(msg)) => self.fail(format!("{site}: {msg}")),
            Err(p) => {
                let what = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                self.fail(format!("{site}: recovery panicked: {what}"))
            }
        }
    }
}

fn engine_config(cfg: &Config) -> EngineConfig {
    EngineConfig {
        durability: cfg.durability,
        initial_capacity: cfg.initial_capacity,
        threads: 1,
    }
}

/// Crash states kept from one recovery, to recover again.
const RECRASH_IMAGES: usize = 2;

/// The size a checked pool may grow to: the fresh pool's limit, and the
/// recovered one's, so that a crash image taken before a growth recovers to
/// a pool that can still make it (the check's new insert may need it).
fn max_pool_size(cfg: &Config) -> u64 {
    cfg.pool_size * 4
}

/// Recovers `image` and checks it. With `recrash`, crash states are also
/// taken during the recovery itself (pool and engine), up to
/// [`RECRASH_IMAGES`] of its fences drawn from that seed, and each must
/// recover to a state the same model allows: recovery must survive its own
/// crash. Returns the leaked bytes and the number of images checked.
fn verify(
    spec: EngineSpec,
    ecfg: &EngineConfig,
    durability: Durability,
    image: Vec<u8>,
    max_size: u64,
    model: &Model,
    recrash: Option<u64>,
) -> std::result::Result<(u64, u64), String> {
    let EngineKind::Persistent { open, .. } = spec.kind else {
        return Err("not a persistent engine".into());
    };
    type Kept = (u64, Vec<(u64, Vec<u8>)>);
    let kept: Arc<Mutex<Kept>> = Arc::new(Mutex::new((0, Vec::new())));
    let pool = match recrash {
        None => Pool::from_image_growable(image, Mode::Simulated, max_size),
        Some(seed) => {
            let kept = kept.clone();
            let mut rng = Rng(seed);
            Pool::from_image_hooked(
                image,
                max_size,
                Box::new(move |fence, site| {
                    // Reservoir sampling over the recovery's fences.
                    let mut k = kept.lock().expect("recrash lock");
                    k.0 += 1;
                    let slot = if k.1.len() < RECRASH_IMAGES {
                        Some(k.1.len())
                    } else {
                        let j = (rng.next() % k.0) as usize;
                        (j < RECRASH_IMAGES).then_some(j)
                    };
                    if let Some(j) = slot {
                        let choice = match rng.next() % 3 {
                            0 => CrashChoice::Persisted,
                            1 => CrashChoice::Newest,
                            _ => CrashChoice::Random(rng.next()),
                        };
                        let img = (fence, site.image(choice));
                        if j == k.1.len() {
                            k.1.push(img);
                        } else {
                            k.1[j] = img;
                        }
                    }
                }),
            )
        }
    };
    let pool = Arc::new(pool.map_err(|e| format!("pool recovery failed: {e}"))?);
    let engine = open(pool.clone(), ecfg).map_err(|e| format!("engine recovery failed: {e}"))?;
    if recrash.is_some() {
        pool.set_fence_hook(None).map_err(|e| e.to_string())?;
    }
    let mut checked = 1u64;
    let mut leaked_total = 0;
    let images = std::mem::take(&mut kept.lock().expect("recrash lock").1);
    for (fence, img) in images {
        let (leaked, n) = verify(spec, ecfg, durability, img, max_size, model, None)
            .map_err(|e| format!("crash at fence {fence} of the recovery: {e}"))?;
        checked += n;
        leaked_total += leaked;
    }
    let mut found: HashMap<u64, u64> = HashMap::new();
    let mut twice = Vec::new();
    engine.for_each(&mut |k, v| {
        if found.insert(k, v).is_some() {
            twice.push(k);
        }
    });
    if let Some(k) = twice.first() {
        return Err(format!("key {k:#x} is stored twice"));
    }
    let mut keys: HashSet<u64> = found.keys().copied().collect();
    keys.extend(model.committed.keys().copied());
    if let Some(op) = model.in_flight {
        keys.insert(op.key);
    }
    let mut sorted: Vec<u64> = keys.into_iter().collect();
    sorted.sort_unstable();
    for k in sorted {
        let got = found.get(&k).copied();
        let allowed = model.allowed(durability, k);
        if !allowed.contains(&got) {
            let what = match (got, model.committed.get(&k)) {
                (Some(_), None) if !allowed.iter().any(|a| a.is_some()) => {
                    "invented or resurrected key"
                }
                (None, Some(_)) => "acknowledged write lost",
                _ => "wrong value",
            };
            let allowed: Vec<String> = allowed.iter().map(|v| fmt_val(*v)).collect();
            return Err(format!(
                "{what}: key {k:#x} recovered as {}, allowed {{{}}} (in flight: {:?})",
                fmt_val(got),
                allowed.join(", "),
                model.in_flight
            ));
        }
        if engine.get(k) != got {
            return Err(format!(
                "get({k:#x}) = {} but the walk found {}",
                fmt_val(engine.get(k)),
                fmt_val(got)
            ));
        }
    }
    if engine.len() != found.len() as u64 {
        return Err(format!(
            "len() = {} but the walk found {} keys",
            engine.len(),
            found.len()
        ));
    }
    let report = engine
        .check()
        .map_err(|e| format!("check() failed after recovery: {e}"))?;
    let in_use = pool.stats().bytes_in_use;
    let leaked = in_use.saturating_sub(report.reachable_bytes);
    if report.reachable_bytes > in_use {
        return Err(format!(
            "engine reaches {} bytes but the allocator has only {in_use} in use",
            report.reachable_bytes
        ));
    }
    // The recovered structure must accept new writes.
    let fresh = (0u64..)
        .map(|i| 0x5eed_0000_0000_0000 ^ i)
        .find(|k| !found.contains_key(k))
        .expect("a free key");
    match engine.insert(fresh, 42) {
        Ok(true) if engine.get(fresh) == Some(42) => {}
        Ok(_) => return Err("recovered engine lost a new insert".into()),
        Err(e) => return Err(format!("recovered engine refused a new insert: {e}")),
    }
    let leaked = leaked + leaked_total;
    Ok((leaked, checked))
}

fn run_op(engine: &dyn Engine, op: &Op) -> Result<()> {
    match op.kind {
        OpKind::Insert => engine.insert(op.key, op.value).map(|_| ()),
        OpKind::Update => engine.update(op.key, op.value).map(|_| ()),
        OpKind::Upsert => engine.upsert(op.key, op.value),
        OpKind::Remove => engine.remove(op.key).map(|_| ()),
        OpKind::Get => {
            engine.get(op.key);
            Ok(())
        }
        OpKind::Sync => engine.sync(),
    }
}

fn fresh_engine(spec: &EngineSpec, cfg: &Config) -> Result<(Arc<Pool>, Box<dyn Engine>)> {
    let EngineKind::Persistent { layout, create, .. } = spec.kind else {
        return Err(Error::InvalidArgument(format!(
            "{} is not a persistent engine",
            spec.name
        )));
    };
    let opts = PoolOptions {
        mode: Mode::Simulated,
        size: cfg.pool_size,
        max_size: max_pool_size(cfg),
        layout: layout.to_string(),
        // A uuid from the seed: engines that seed their hashes from it
        // behave the same in the dry run and the checked run.
        uuid: Some({
            let mut u = [0u8; 16];
            u[..8].copy_from_slice(&cfg.seed.to_le_bytes());
            u[8..].copy_from_slice(b"crashtst");
            u
        }),
        ..PoolOptions::default()
    };
    let pool = Arc::new(Pool::create(Path::new(""), &opts)?);
    let engine = create(pool.clone(), &engine_config(cfg))?;
    Ok((pool, engine))
}

/// Which crash states to take at each site (fences and operation gaps, in
/// the order the dry run met them), given the undecided lines written since
/// the previous fence at each (`CrashSite::recent_lines`): exactly `states`
/// images.
///
/// Half the budget goes to the sites with two or more such lines (where a
/// store can become durable before another it depends on): at each, the
/// states in which one of them alone is written back and in which one alone
/// is not, for up to four of them (spread over their addresses). The other half, and
/// whatever the first half leaves, is spread evenly over all sites, cycling
/// through the persisted, the newest and a random state. Resize and
/// movement fences, rare but dense in ordering constraints, are thereby
/// checked in proportion to their risk, not their number.
fn plan_states(recent: &[Vec<u64>], states: u64, seed: u64) -> Vec<Vec<CrashChoice>> {
    let mut plan: Vec<Vec<CrashChoice>> = vec![Vec::new(); recent.len()];
    if recent.is_empty() || states == 0 {
        return plan;
    }
    let targeted = |lines: &[u64]| -> Vec<CrashChoice> {
        let u = lines.len();
        let picks: Vec<u64> = if u <= 4 {
            lines.to_vec()
        } else {
            (0..4).map(|k| lines[k * (u - 1) / 3]).collect()
        };
        picks
            .iter()
            .flat_map(|&l| [CrashChoice::OnlyNew(l), CrashChoice::AllButOld(l)])
            .collect()
    };
    let interesting: Vec<usize> = (0..recent.len())
        .filter(|&i| recent[i].len() >= 2)
        .collect();
    let demand: u64 = interesting
        .iter()
        .map(|&i| targeted(&recent[i]).len() as u64)
        .sum();
    let half = states / 2;
    let mut used = 0u64;
    if demand > 0 {
        // Every interesting site if they fit, else an even sample of them.
        let n = interesting.len() as u64;
        let per = (demand / n).max(1);
        let take = if demand <= half {
            n
        } else {
            (half / per).clamp(1, n)
        };
        for k in 0..take {
            let i = interesting[(k * n / take) as usize];
            for c in targeted(&recent[i]) {
                if used < states {
                    plan[i].push(c);
                    used += 1;
                }
            }
        }
    }
    let rest = states - used;
    let sites = recent.len() as u64;
    let mut turn = 0u64;
    for (i, p) in plan.iter_mut().enumerate() {
        let i = i as u64;
        let take = ((i + 1) * rest) / sites - (i * rest) / sites;
        for _ in 0..take {
            turn += 1;
            p.push(match turn % 3 {
                0 => CrashChoice::Persisted,
                1 => CrashChoice::Newest,
                _ => CrashChoice::Random(seed ^ turn.wrapping_mul(0x2545_f491_4f6c_dd1d)),
            });
        }
    }
    plan
}

/// Runs the crash test of `spec` and returns its report. `Err` only when the
/// test cannot run at all (the engine fails without any crash).
pub fn run(spec: &EngineSpec, cfg: &Config) -> Result<Report> {
    let ops = workload(cfg);
    // Dry run: the sites (every fence, and the gap after every operation)
    // and how many cache lines are undecided at each.
    let (pool, engine) = fresh_engine(spec, cfg)?;
    let start_fences = pool.fence_count();
    let profile = Arc::new(Mutex::new(Vec::<Vec<u64>>::new()));
    {
        let profile = profile.clone();
        pool.set_fence_hook(Some(Box::new(move |_, site| {
            profile
                .lock()
                .expect("profile lock")
                .push(site.recent_lines());
        })))?;
    }
    for op in &ops {
        run_op(engine.as_ref(), op)?;
        let recent = pool.recent_lines()?;
        profile.lock().expect("profile lock").push(recent);
    }
    pool.set_fence_hook(None)?;
    let fences = pool.fence_count() - start_fences;
    let detail = engine.stats().detail;
    drop(engine);
    drop(pool);
    let profile = std::mem::take(&mut *profile.lock().expect("profile lock"));
    let plan = Arc::new(plan_states(&profile, cfg.states, cfg.seed));

    let (pool, engine) = fresh_engine(spec, cfg)?;
    let base = pool.fence_count();
    let checker = Arc::new(Mutex::new(Checker {
        spec: *spec,
        cfg: cfg.clone(),
        checked: 0,
        report: Report {
            engine: spec.name.to_string(),
            durability: cfg.durability,
            seed: cfg.seed,
            fences,
            ops: ops.len() as u64,
            detail,
            ..Report::default()
        },
    }));
    let model = Arc::new(Mutex::new(Model::default()));
    let site_no = Arc::new(Mutex::new(0u64));
    {
        let (checker, model, site_no, plan) = (
            checker.clone(),
            model.clone(),
            site_no.clone(),
            plan.clone(),
        );
        pool.set_fence_hook(Some(Box::new(move |fence, site| {
            let mut s = site_no.lock().expect("site lock");
            let choices = plan.get(*s as usize).cloned().unwrap_or_default();
            *s += 1;
            drop(s);
            let model = model.lock().expect("model lock");
            let mut c = checker.lock().expect("checker lock");
            for choice in choices {
                let img = site.image(choice);
                c.check_image(img, &model, &format!("fence {} ({choice:?})", fence - base));
            }
        })))?;
    }
    for (i, op) in ops.iter().enumerate() {
        model.lock().expect("model lock").in_flight = Some(*op);
        run_op(engine.as_ref(), op)
            .map_err(|e| Error::Corrupt(format!("operation {i} ({op:?}) failed: {e}")))?;
        let mut m = model.lock().expect("model lock");
        m.complete(op);
        // A site between operations: nothing in flight.
        let choices = {
            let mut s = site_no.lock().expect("site lock");
            let t = plan.get(*s as usize).cloned().unwrap_or_default();
            *s += 1;
            t
        };
        let mut c = checker.lock().expect("checker lock");
        for choice in choices {
            let img = pool.crash_image(choice)?;
            c.check_image(img, &m, &format!("after op {i} {:?} ({choice:?})", op.kind));
        }
    }
    pool.set_fence_hook(None)?;
    // A clean close must reopen with every key.
    engine.close()?;
    let img = pool.crash_image(CrashChoice::Persisted)?;
    let m = model.lock().expect("model lock");
    let mut c = checker.lock().expect("checker lock");
    c.check_image(img, &m, "after clean close");
    Ok(c.report.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_allows_in_flight_outcomes_only() {
        let mut m = Model::default();
        let ins = Op {
            kind: OpKind::Insert,
            key: 7,
            value: 70,
        };
        m.complete(&ins);
        m.in_flight = Some(Op {
            kind: OpKind::Update,
            key: 7,
            value: 71,
        });
        assert_eq!(m.allowed(Durability::Strict, 7), vec![Some(70), Some(71)]);
        assert_eq!(m.allowed(Durability::Strict, 8), vec![None]);
        // Relaxed: every state since the last sync.
        assert_eq!(
            m.allowed(Durability::Relaxed, 7),
            vec![None, Some(70), Some(70), Some(71)]
        );
        m.complete(&Op {
            kind: OpKind::Sync,
            key: 0,
            value: 0,
        });
        assert_eq!(m.allowed(Durability::Relaxed, 7), vec![Some(70)]);
    }

    #[test]
    fn workload_has_sentinel_keys_and_every_op() {
        let ops = workload(&Config::default());
        let kinds: HashSet<_> = ops.iter().map(|o| format!("{:?}", o.kind)).collect();
        assert_eq!(kinds.len(), 6);
        assert!(ops.iter().any(|o| o.key == 0));
        assert!(ops.iter().any(|o| o.key == u64::MAX));
    }
}
