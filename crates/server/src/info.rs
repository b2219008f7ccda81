//! `INFO [section ...]`: Redis's sections with the figures pmhash has,
//! and a `store` section of its own.
//!
//! The server line follows the convention other Redis-protocol servers
//! use: `redis_version` names the Redis command set and protocol it
//! speaks (what clients test for features), while `server_name` and
//! `pmhash_version` say what it is.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use crate::Shared;

/// Sections in the order `INFO` prints them, and whether a plain `INFO`
/// (or `INFO default`) includes each.
const SECTIONS: &[(&str, bool)] = &[
    ("server", true),
    ("clients", true),
    ("memory", true),
    ("persistence", true),
    ("stats", true),
    ("keyspace", true),
    ("store", true),
];

/// The text of `INFO` for the section names in `args` (none: the
/// default sections; `all` or `everything`: every one). An unknown name
/// adds nothing, as in Redis.
pub(crate) fn info(sh: &Shared, args: &[Vec<u8>]) -> String {
    let asked: Vec<String> = args
        .iter()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .collect();
    let want = |name: &str, default: bool| {
        if asked.is_empty() {
            return default;
        }
        asked
            .iter()
            .any(|a| a == name || a == "all" || a == "everything" || (a == "default" && default))
    };
    let mut out = String::new();
    for &(name, default) in SECTIONS {
        if !want(name, default) {
            continue;
        }
        if !out.is_empty() {
            out.push_str("\r\n");
        }
        let title = format!("{}{}", name[..1].to_ascii_uppercase(), &name[1..]);
        let _ = write!(out, "# {title}\r\n");
        for (k, v) in section(sh, name) {
            let _ = write!(out, "{k}:{v}\r\n");
        }
    }
    out
}

fn section(sh: &Shared, name: &str) -> Vec<(&'static str, String)> {
    let st = || sh.store.stats();
    match name {
        "server" => vec![
            ("redis_version", "7.0.0".into()),
            ("server_name", "pmhash".into()),
            ("pmhash_version", env!("CARGO_PKG_VERSION").into()),
            ("redis_mode", "standalone".into()),
            ("os", std::env::consts::OS.into()),
            ("arch_bits", (usize::BITS).to_string()),
            ("process_id", std::process::id().to_string()),
            ("tcp_port", sh.port.to_string()),
            (
                "uptime_in_seconds",
                sh.started.elapsed().as_secs().to_string(),
            ),
            (
                "uptime_in_days",
                (sh.started.elapsed().as_secs() / 86_400).to_string(),
            ),
            ("event_loops", sh.workers.len().to_string()),
            ("busy_poll_us", sh.busy_poll.as_micros().to_string()),
        ],
        "clients" => {
            let (qbuf, omem) = sh.registry.biggest();
            vec![
                (
                    "connected_clients",
                    sh.clients.load(Ordering::Relaxed).to_string(),
                ),
                ("maxclients", sh.max_clients.to_string()),
                ("client_recent_max_input_buffer", qbuf.to_string()),
                ("client_recent_max_output_buffer", omem.to_string()),
                ("blocked_clients", "0".into()),
                (
                    "watching_clients",
                    sh.registry
                        .all()
                        .iter()
                        .filter(|c| c.watching.load(Ordering::Relaxed) > 0)
                        .count()
                        .to_string(),
                ),
            ]
        }
        "memory" => {
            let rss = rss_bytes();
            let s = st();
            vec![
                ("used_memory_rss", rss.to_string()),
                ("used_memory_rss_human", human(rss)),
                ("mem_clients_normal", sh.budget.used().to_string()),
                ("maxmemory_clients", sh.budget.limit.to_string()),
                ("maxmemory", "0".into()),
                ("maxmemory_policy", "noeviction".into()),
                ("store_pm_bytes", s.pm_bytes.to_string()),
                ("store_log_bytes", s.log_bytes.to_string()),
                ("store_live_bytes", s.live_bytes.to_string()),
            ]
        }
        "persistence" => {
            let s = st();
            let w = |f: fn(&crate::stats::WorkerStats) -> u64| -> u64 {
                sh.workers.iter().map(|m| f(&m.stats)).sum()
            };
            vec![
                ("persist_fences", w(|s| s.fences.get()).to_string()),
                ("persist_flushes", w(|s| s.flushes.get()).to_string()),
                ("loading", "0".into()),
                ("durability", sh.durability.clone()),
                ("rdb_changes_since_last_save", "0".into()),
                ("aof_enabled", "0".into()),
                ("store_opened_from", s.opened_from.to_string()),
                ("store_open_ms", format!("{:.2}", s.open_ms)),
                ("store_gc_runs", s.gc_runs.to_string()),
            ]
        }
        "stats" => {
            let w = |f: fn(&crate::stats::WorkerStats) -> u64| -> u64 {
                sh.workers.iter().map(|m| f(&m.stats)).sum()
            };
            vec![
                (
                    "total_connections_received",
                    sh.connections_received.load(Ordering::Relaxed).to_string(),
                ),
                (
                    "total_commands_processed",
                    sh.commands.load(Ordering::Relaxed).to_string(),
                ),
                ("total_net_input_bytes", w(|s| s.net_in.get()).to_string()),
                ("total_net_output_bytes", w(|s| s.net_out.get()).to_string()),
                (
                    "rejected_connections",
                    sh.rejected_connections.load(Ordering::Relaxed).to_string(),
                ),
                (
                    "client_memory_limit_refusals",
                    sh.budget.refusals.load(Ordering::Relaxed).to_string(),
                ),
                (
                    "client_query_buffer_limit_disconnections",
                    w(|s| s.closed_for_input.get()).to_string(),
                ),
                ("expired_keys", "0".into()),
                ("evicted_keys", "0".into()),
            ]
        }
        "keyspace" => {
            let keys = sh.store.len();
            if keys == 0 {
                Vec::new()
            } else {
                vec![("db0", format!("keys={keys},expires=0,avg_ttl=0"))]
            }
        }
        "store" => {
            let s = st();
            vec![
                ("store_files", s.files.to_string()),
                ("store_log_bytes", s.log_bytes.to_string()),
                ("store_live_bytes", s.live_bytes.to_string()),
                (
                    "store_space_amplification",
                    format!("{:.3}", s.space_amplification),
                ),
                ("store_pm_bytes", s.pm_bytes.to_string()),
                ("store_gc_runs", s.gc_runs.to_string()),
                ("store_files_reclaimed", s.files_reclaimed.to_string()),
                ("store_raf_enabled", u8::from(s.raf_enabled).to_string()),
                ("store_raf_hits", s.raf_hits.to_string()),
                ("store_nodes", s.nodes.to_string()),
                ("store_clusters", s.clusters.to_string()),
                ("store_opened_from", s.opened_from.to_string()),
                ("store_open_ms", format!("{:.2}", s.open_ms)),
            ]
        }
        _ => Vec::new(),
    }
}

/// The process's resident memory, from `/proc/self/statm` (0 where that
/// does not exist).
pub(crate) fn rss_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(0) as u64
}

fn human(b: u64) -> String {
    let (v, u) = match b {
        b if b >= 1 << 30 => (b as f64 / (1u64 << 30) as f64, "G"),
        b if b >= 1 << 20 => (b as f64 / (1u64 << 20) as f64, "M"),
        b if b >= 1 << 10 => (b as f64 / 1024.0, "K"),
        b => (b as f64, "B"),
    };
    format!("{v:.2}{u}")
}
