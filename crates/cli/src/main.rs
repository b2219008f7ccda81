//! `pmhash`: benchmark, crash-test, inspect and check persistent hash indexes.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use engine::crashtest::{self, Config};
use engine::{Durability, EngineConfig, EngineKind};
use pmem::{Mode, Pool, PoolOptions};

mod registry;

#[derive(Parser, Debug)]
#[command(
    name = "pmhash",
    version,
    about = "Persistent hash indexes for hybrid DRAM + PM: benchmark, crash-test, inspect, check"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Benchmark engines and DRAM baselines (YCSB-style workloads).
    Bench(Box<bench::BenchArgs>),
    /// Crash-test an engine: recover many simulated crash states and check
    /// each against the durability contract. Exits non-zero on any violation.
    Crashtest(CrashArgs),
    /// Print a pool's header, allocator figures and engine statistics
    /// (read-only: the file is never written).
    Inspect {
        /// The pool file.
        pool: PathBuf,
    },
    /// Verify a pool and its engine structure, read-only (fsck); with
    /// --repair, salvage a store's log first. Exits non-zero on any
    /// inconsistency.
    Check {
        /// The pool file.
        pool: PathBuf,
        /// Store pools only: drop the corrupt log bytes that make an open
        /// refuse the store (printing each stretch dropped and what it
        /// held), then check. Needs the store closed.
        #[arg(long)]
        repair: bool,
    },
    /// List the engines this build knows.
    Engines,
    /// Serve the store in DIR over the Redis protocol (RESP2/RESP3).
    Serve(ServeArgs),
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// The store's directory (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6379")]
    addr: String,
    /// Event-loop threads serving the clients (0: one per CPU less one, at
    /// least one), and threads for crash recovery at open (0: one per
    /// CPU).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// strict (a write is durable when acknowledged) or relaxed.
    #[arg(long, default_value = "strict")]
    durability: String,
    /// Require AUTH with this password before any other command.
    #[arg(long)]
    requirepass: Option<String>,
    /// Most client connections at once (as Redis's maxclients).
    #[arg(long, default_value_t = server::MAX_CLIENTS)]
    maxclients: u64,
    /// Pool mode of a new store: mapped (files) or dax.
    #[arg(long, default_value = "mapped")]
    mode: String,
    /// Microseconds an event loop that just served requests keeps polling
    /// before it sleeps (0: sleep at once, as Redis does). Lowers the
    /// latency of unpipelined requests; costs CPU while requests come less
    /// than this far apart. Default: 50 while the loops leave a CPU free,
    /// else 0.
    #[arg(long)]
    busy_poll_us: Option<u64>,
    /// Bytes all clients together may hold beyond 256 KiB each (input,
    /// unsent replies, queued transactions), as Redis's maxmemory-clients:
    /// a number with an optional k/kb/m/mb/g/gb.
    #[arg(long, default_value = "1gb")]
    maxmemory_clients: String,
    /// Most unsent reply bytes one client may have: a reply that would
    /// pass it is answered with an error instead.
    #[arg(long, default_value = "64mb")]
    client_output_limit: String,
}

#[derive(clap::Args, Debug)]
struct CrashArgs {
    /// Engine name (see `pmhash engines`).
    #[arg(long)]
    engine: String,
    /// Operations in the workload.
    #[arg(long, default_value_t = 2000)]
    ops: u64,
    /// Crash states to recover and check.
    #[arg(long, default_value_t = 2000)]
    states: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// strict or relaxed.
    #[arg(long, default_value = "strict")]
    durability: String,
    /// Distinct keys the workload draws from.
    #[arg(long, default_value_t = 600)]
    key_space: u64,
    /// Write the result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Serve(args) => serve_cmd(&args),
        Cmd::Bench(args) => bench::run_cli(&args, &registry::all()).map(|_| ExitCode::SUCCESS),
        Cmd::Crashtest(args) => crashtest_cmd(&args),
        Cmd::Inspect { pool } => inspect(&pool),
        Cmd::Check { pool, repair } => match repair.then(|| repair_store(&pool)) {
            Some(Err(e)) => {
                println!("FAIL {e}");
                Ok(ExitCode::FAILURE)
            }
            _ => check(&pool),
        },
        Cmd::Engines => {
            for s in registry::all() {
                let kind = if s.is_persistent() {
                    "persistent"
                } else {
                    "DRAM baseline"
                };
                println!("{:<22} {:<14} {}", s.name, kind, s.about);
            }
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("pmhash: {msg}");
            ExitCode::from(2)
        }
    }
}

fn serve_cmd(args: &ServeArgs) -> Result<ExitCode, String> {
    // Every argument is checked, and the address bound, before the store
    // is opened (or made): a refused run leaves the directory as it was.
    let cfg = server::Config {
        addr: args.addr.clone(),
        requirepass: args.requirepass.clone(),
        threads: args.threads,
        max_clients: args.maxclients,
        busy_poll: args.busy_poll_us.map(std::time::Duration::from_micros),
        max_client_memory: server::parse_bytes(&args.maxmemory_clients)
            .map_err(|e| format!("--maxmemory-clients: {e}"))?,
        client_output_limit: server::parse_bytes(&args.client_output_limit)
            .map_err(|e| format!("--client-output-limit: {e}"))?,
    };
    cfg.validate()?;
    let opts = store::Options {
        create: store::CreateOptions {
            // The paper's best cluster count at few threads; 256 clusters would
            // make 256 lazily zeroed 8 MiB files for the first few hundred keys.
            clusters: 16,
            ..Default::default()
        },
        open: store::OpenOptions {
            durability: Durability::parse(&args.durability).map_err(|e| e.to_string())?,
            mode: Mode::parse(&args.mode).map_err(|e| e.to_string())?,
            recovery_threads: args.threads,
            ..Default::default()
        },
    };
    let listener = std::net::TcpListener::bind(&args.addr)
        .map_err(|e| format!("cannot listen on {}: {e}", args.addr))?;
    let st = store::Store::open(&args.dir, opts)
        .map_err(|e| format!("cannot open the store in {}: {e}", args.dir.display()))?;
    server::install_signal_handlers();
    let srv = server::Server::start_on(st, cfg, listener)
        .map_err(|e| format!("cannot serve on {}: {e}", args.addr))?;
    println!("pmhash serve: listening on {}", srv.addr());
    srv.wait()
        .map_err(|e| format!("clean shutdown failed: {e}"))?;
    println!("pmhash serve: store closed cleanly");
    Ok(ExitCode::SUCCESS)
}

fn crashtest_cmd(args: &CrashArgs) -> Result<ExitCode, String> {
    let spec = registry::find(&args.engine)?;
    if !spec.is_persistent() {
        return Err(format!(
            "{} is a DRAM baseline: nothing to crash-test",
            spec.name
        ));
    }
    let durability = Durability::parse(&args.durability).map_err(|e| e.to_string())?;
    let cfg = Config {
        ops: args.ops,
        states: args.states,
        seed: args.seed,
        durability,
        key_space: args.key_space.max(4),
        ..Config::default()
    };
    let started = std::time::Instant::now();
    let report = crashtest::run(&spec, &cfg)
        .map_err(|e| format!("crash test of {} could not run: {e}", spec.name))?;
    println!(
        "crashtest {} ({}): {} ops, {} fences, {} crash states checked ({} during recovery), {} violations, {} leaked bytes, seed {} [{:.1}s]",
        report.engine,
        durability.name(),
        report.ops,
        report.fences,
        report.states,
        report.recovery_crashes,
        report.violations,
        report.leaked_bytes,
        report.seed,
        started.elapsed().as_secs_f64()
    );
    if !report.detail.is_empty() {
        let d: Vec<String> = report
            .detail
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        println!("  paths: {}", d.join(", "));
    }
    for m in &report.messages {
        println!("  violation: {m}");
    }
    if let Some(path) = &args.json {
        std::fs::write(path, report.to_json() + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(if report.violations == 0 && report.leaked_bytes == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn open_read_only(path: &Path) -> Result<Pool, String> {
    let opts = PoolOptions {
        mode: Mode::Mapped,
        read_only: true,
        ..PoolOptions::default()
    };
    Pool::open(path, &opts).map_err(|e| format!("{}: {e}", path.display()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn inspect(path: &Path) -> Result<ExitCode, String> {
    let pool = Arc::new(open_read_only(path)?);
    let id = pool.identity();
    let st = pool.header_state();
    let ps = pool.stats();
    println!("pool            {}", path.display());
    println!("format version  {}", id.version);
    println!("layout          {}", id.layout);
    println!("uuid            {}", hex(&id.uuid));
    println!("created         {} ns since the epoch", id.created_unix_ns);
    println!("size            {} bytes ({} MiB)", st.size, st.size >> 20);
    println!("root            {:#x}", st.root);
    println!(
        "clean shutdown  {}",
        if pool.was_clean() {
            "yes"
        } else {
            "no (recovery runs at open)"
        }
    );
    println!("opens           {}", st.opens);
    println!(
        "writer          {}",
        if pool.writer_active() {
            "a process has the pool open for writing: what follows may be mid-update"
        } else {
            "none"
        }
    );
    println!("header seq      {}", st.seq);
    println!(
        "mode            {} (opened read-only, copy-on-write: the file is not written)",
        pool.mode().name()
    );
    println!("flush           {}", pmem::persist::flush_instr().name());
    println!(
        "heap in use     {} bytes in {} blocks",
        ps.bytes_in_use, ps.blocks_in_use
    );
    println!(
        "free chunks     {} of {} bytes",
        ps.free_chunks,
        pmem::CHUNK
    );
    println!(
        "pending lanes   {} (settled in memory by this read-only open)",
        ps.recovered_lanes
    );
    match registry::find_layout(&id.layout) {
        Some(spec) => {
            let EngineKind::Persistent { open, .. } = spec.kind else {
                unreachable!("find_layout returns persistent specs")
            };
            match open(pool.clone(), &EngineConfig::default()) {
                Ok(e) => {
                    let s = e.stats();
                    println!("engine          {}", spec.name);
                    println!("keys            {}", s.len);
                    println!(
                        "capacity        {} slots (load factor {:.3})",
                        s.capacity, s.load_factor
                    );
                    println!("engine PM       {} bytes", s.pm_bytes);
                    println!("engine DRAM     {} bytes", s.dram_bytes);
                    for (k, v) in s.detail {
                        println!("{k:<15} {v}");
                    }
                }
                Err(e) => println!("engine          {} (cannot open: {e})", spec.name),
            }
        }
        None => println!(
            "engine          unknown layout {:?} (no engine of this build reads it)",
            id.layout
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// `check --repair`: the store's salvage path; prints what it drops.
fn repair_store(path: &Path) -> Result<(), String> {
    let dropped = store::Store::repair(path).map_err(|e| format!("repair: {e}"))?;
    if dropped.is_empty() {
        println!("repair: nothing to drop");
    }
    for d in &dropped {
        println!("repair: {d}");
    }
    Ok(())
}

fn check(path: &Path) -> Result<ExitCode, String> {
    let pool = match open_read_only(path) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            println!("FAIL {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    if pool.writer_active() {
        println!(
            "NOTE a process has {} open for writing: this check reads a copy that may be mid-update",
            path.display()
        );
    }
    let layout = pool.layout().to_string();
    let Some(spec) = registry::find_layout(&layout) else {
        println!("FAIL pool layout {layout:?} is not known to this build");
        return Ok(ExitCode::FAILURE);
    };
    let EngineKind::Persistent { open, .. } = spec.kind else {
        unreachable!("find_layout returns persistent specs")
    };
    let engine = match open(pool.clone(), &EngineConfig::default()) {
        Ok(e) => e,
        Err(e) => {
            println!("FAIL {} cannot open: {e}", spec.name);
            return Ok(ExitCode::FAILURE);
        }
    };
    let report = match engine.check() {
        Ok(r) => r,
        Err(e) => {
            println!("FAIL {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let in_use = pool.stats().bytes_in_use;
    if in_use != report.reachable_bytes {
        println!(
            "FAIL allocator has {in_use} bytes in use but the {} structure reaches {} ({} leaked)",
            spec.name,
            report.reachable_bytes,
            in_use as i128 - report.reachable_bytes as i128
        );
        return Ok(ExitCode::FAILURE);
    }
    println!(
        "OK {}: {} keys, {} bytes reachable, allocator consistent{}",
        spec.name,
        report.keys,
        report.reachable_bytes,
        if pool.was_clean() {
            ""
        } else {
            " (recovered from an unclean shutdown, in memory only)"
        }
    );
    Ok(ExitCode::SUCCESS)
}
