#!/usr/bin/env bash
# Runs the official YCSB (site.ycsb:core 0.17.0) workloads A-F against
# `pmhash serve` through the binding in this folder, and prints a Markdown
# table of throughput and p99 latencies.
#
# Every workload gets a fresh store (a new directory under $STORE_ROOT) and a
# fresh server: load phase (RECORDS inserts), run phase (OPS operations),
# then SHUTDOWN. So the workloads do not see each other's inserts/updates,
# and every load-phase row measures the same thing.
#
# Environment:
#   RECORDS=100000     records loaded (YCSB recordcount)
#   OPS=100000         operations in the run phase (YCSB operationcount)
#   THREADS=2          YCSB client threads (= connections)
#   WORKLOADS="a b c d e f"
#   DURABILITY=strict  pmhash serve --durability (strict|relaxed)
#   SERVE_FLAGS=...    extra arguments for pmhash serve (e.g. "--threads 2")
#   STORE_ROOT=/dev/shm  where the fresh store directories go
#   PMHASH_BIN=...     use this pmhash binary instead of `cargo build --release`
#   MVN_FLAGS=...      extra Maven flags (e.g. -o to stay offline)
#   YCSB_FLAGS=...     extra arguments for site.ycsb.Client (e.g. "-p dataintegrity=true")
#   JAVA_OPTS=...      JVM flags for the YCSB client
# Raw outputs (YCSB and server logs, the table) go to results/<timestamp>/.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$here"

RECORDS=${RECORDS:-100000}
OPS=${OPS:-100000}
THREADS=${THREADS:-2}
WORKLOADS=${WORKLOADS:-"a b c d e f"}
DURABILITY=${DURABILITY:-strict}
STORE_ROOT=${STORE_ROOT:-/dev/shm}
[ -d "$STORE_ROOT" ] && [ -w "$STORE_ROOT" ] || STORE_ROOT=${TMPDIR:-/tmp}
DB_CLASS=site.ycsb.db.pmhash.PmhashClient

log() { echo "run.sh: $*" >&2; }

# ---- build --------------------------------------------------------------
log "building the binding (mvn package)"
# (Debian's Maven 3.8 prints stray ANSI resets even with -q: its output is
# shown only when it fails.)
mvnlog=$(mktemp)
# shellcheck disable=SC2086
if ! mvn -q -B -Dstyle.color=never ${MVN_FLAGS:-} package >"$mvnlog" 2>&1; then
  cat "$mvnlog" >&2; rm -f "$mvnlog"; log "mvn package failed"; exit 1
fi
rm -f "$mvnlog"
CP="$here/target/pmhash-ycsb-binding.jar:$here/target/dependency/*"

if [ -n "${PMHASH_BIN:-}" ]; then
  PMHASH=$PMHASH_BIN
else
  log "building pmhash (cargo build --release)"
  (cd "$repo" && cargo build --release -q --bin pmhash)
  PMHASH=$repo/target/release/pmhash
fi
[ -x "$PMHASH" ] || { log "no pmhash binary at $PMHASH"; exit 1; }

out="$here/results/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
log "raw outputs in $out"

# ---- server lifecycle ---------------------------------------------------
srv_pid=""
srv_port=""
srv_dir=""

start_server() { # $1: name for the log
  srv_dir=$(mktemp -d "$STORE_ROOT/pmhash-ycsb.XXXXXX")
  local slog="$out/server-$1.log"
  # shellcheck disable=SC2086 # SERVE_FLAGS is a list of arguments
  "$PMHASH" serve --dir "$srv_dir/db" --addr 127.0.0.1:0 --durability "$DURABILITY" \
    ${SERVE_FLAGS:-} >"$slog" 2>&1 &
  srv_pid=$!
  local i
  for i in $(seq 1 300); do
    if grep -q 'listening on' "$slog" 2>/dev/null; then
      srv_port=$(sed -n 's/.*listening on .*:\([0-9][0-9]*\)$/\1/p' "$slog" | head -n1)
      [ -n "$srv_port" ] && return 0
    fi
    kill -0 "$srv_pid" 2>/dev/null || break
    sleep 0.1
  done
  log "pmhash serve did not start:"; cat "$slog" >&2
  return 1
}

# SHUTDOWN over a raw RESP connection (no redis-cli needed), then wait for
# the process. Falls back to SIGTERM, then SIGKILL, and says so.
stop_server() { # $1: name for the log
  [ -n "$srv_pid" ] || return 0
  local rc=0 i
  if kill -0 "$srv_pid" 2>/dev/null; then
    if exec 3<>"/dev/tcp/127.0.0.1/$srv_port"; then
      printf '*1\r\n$8\r\nSHUTDOWN\r\n' >&3 || true
      timeout 10 cat <&3 >/dev/null 2>&1 || true
      exec 3>&- 3<&- || true
    fi
    for i in $(seq 1 300); do
      kill -0 "$srv_pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$srv_pid" 2>/dev/null; then
      log "server ($1) still up 30 s after SHUTDOWN; sending SIGTERM"
      kill -TERM "$srv_pid" 2>/dev/null || true
      sleep 5
      kill -0 "$srv_pid" 2>/dev/null && { log "server ($1) ignored SIGTERM; SIGKILL"; kill -KILL "$srv_pid" || true; }
    fi
  fi
  wait "$srv_pid" || rc=$?
  if [ "$rc" -ne 0 ] || ! grep -q 'store closed cleanly' "$out/server-$1.log"; then
    log "server ($1) exited with status $rc / no clean close:"; cat "$out/server-$1.log" >&2
    server_problems+=("$1: exit status $rc$(grep -q 'store closed cleanly' "$out/server-$1.log" || echo ', no "store closed cleanly"')")
  fi
  srv_pid=""
  rm -rf "$srv_dir"
  srv_dir=""
}

cleanup() {
  if [ -n "$srv_pid" ]; then stop_server "${current:-exit}" || true; fi
  [ -z "$srv_dir" ] || rm -rf "$srv_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- YCSB ----------------------------------------------------------------
ycsb() { # $1: -load|-t  $2: workload letter  $3: output file
  # shellcheck disable=SC2086
  java ${JAVA_OPTS:-} -cp "$CP" site.ycsb.Client "$1" -db "$DB_CLASS" \
    -P "workloads/workload$2" \
    -p recordcount="$RECORDS" -p operationcount="$OPS" \
    -p pmhash.port="$srv_port" -threads "$THREADS" -s ${YCSB_FLAGS:-} \
    >"$3" 2>&1
}

# One table row from a YCSB output file.
row() { # $1: workload  $2: phase  $3: file  $4: exit status
  awk -F', ' -v w="$1" -v ph="$2" -v rc="$4" '
    /^\[OVERALL\], Throughput/ { thr = sprintf("%.0f", $3) }
    /^\[OVERALL\], RunTime/    { secs = sprintf("%.1f", $3 / 1000) }
    /^\[[A-Z-]+\], 99thPercentileLatency/ { op = substr($1, 2, length($1) - 2); p99[op] = $3 }
    match($0, / [0-9]+ operations;/) { n = substr($0, RSTART + 1, RLENGTH - 13) }
    /^\[[A-Z-]+\], Return=/ {
      op = substr($1, 2, length($1) - 2); r = substr($2, 8)
      if (r != "OK") bad = bad (bad ? ", " : "") op " " r " " $3
    }
    function c(o) { return (o in p99) ? p99[o] : "-" }
    END {
      if (rc != 0) bad = bad (bad ? ", " : "") "YCSB exit status " rc
      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", \
        toupper(w), ph, (n ? n : "-"), (secs ? secs : "-"), (thr ? thr : "FAILED"), \
        c("INSERT"), c("READ"), c("UPDATE"), c("SCAN"), c("READ-MODIFY-WRITE"), (bad ? bad : "none")
    }' "$3"
}

declare -a rows=() server_problems=()
t0=$(date +%s)
for w in $WORKLOADS; do
  current=$w
  start_server "$w"
  log "workload $w: server pid $srv_pid on port $srv_port, store $srv_dir"
  rc=0; ycsb -load "$w" "$out/load-$w.txt" || rc=$?
  rows+=("$(row "$w" load "$out/load-$w.txt" "$rc")")
  log "${rows[-1]}"
  rc=0; ycsb -t "$w" "$out/run-$w.txt" || rc=$?
  rows+=("$(row "$w" run "$out/run-$w.txt" "$rc")")
  log "${rows[-1]}"
  grep -h '^pmhash binding:' "$out/load-$w.txt" "$out/run-$w.txt" | head -n 5 >&2 || true
  stop_server "$w"
done
current=""

{
  echo "YCSB 0.17.0 against pmhash serve ($DURABILITY, store in $STORE_ROOT): RECORDS=$RECORDS OPS=$OPS THREADS=$THREADS, a fresh store per workload; $(nproc) CPUs; $(( $(date +%s) - t0 )) s in all."
  echo
  echo "| workload | phase | ops | time (s) | throughput (ops/s) | p99 INSERT (us) | p99 READ (us) | p99 UPDATE (us) | p99 SCAN (us) | p99 READ-MODIFY-WRITE (us) | not OK |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
  printf '%s\n' "${rows[@]}"
  if [ ${#server_problems[@]} -gt 0 ]; then
    echo
    echo "Server problems: ${server_problems[*]}"
  fi
} | tee "$out/results.md"
