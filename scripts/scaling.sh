#!/usr/bin/env bash
# Scalability runs, 1 to 16 threads, for a machine with at least 16 cores.
# Never part of CI (CI machines have 2 cores).
#
#   scripts/scaling.sh [PMHASH] [OUTDIR]
#
# PMHASH defaults to target/release/pmhash, OUTDIR to docs/bench/scaling;
# THREADS, KEYS and ENGINES (space-separated; "store" for the store) narrow
# the run; SIZING (default --presized: tables sized for KEYS; empty: grown
# from the engines' default) sizes the tables.
# One JSON and one text table per engine, written as each finishes, so a
# run cut short keeps what it measured. Pools go to /dev/shm when it has
# 16 GiB free, else to the temporary directory.
set -euo pipefail

bin=${1:-target/release/pmhash}
out=${2:-docs/bench/scaling}
threads=${THREADS:-1,2,4,8,16}
keys=${KEYS:-10M}
sizing=${SIZING---presized}
mkdir -p "$out"

pool=${TMPDIR:-/tmp}
if [ -d /dev/shm ] && [ "$(df --output=avail -k /dev/shm | tail -1)" -ge $((16 * 1024 * 1024)) ]; then
    pool=/dev/shm
fi

{
    date -u +%FT%TZ
    nproc
    lscpu | grep -E 'Model name|Socket|NUMA node\(s\)|L3'
    df -h "$pool" | tail -1
} > "$out/machine.txt"

run() {
    local name=$1
    shift
    local t0=$SECONDS
    if "$bin" bench --pool "$pool" --keys "$keys" --threads "$threads" $sizing \
        --json "$out/$name.json" "$@" > "$out/$name.txt" 2>&1; then
        echo "$name: $((SECONDS - t0)) s" >> "$out/log.txt"
    else
        echo "$name: FAILED after $((SECONDS - t0)) s" >> "$out/log.txt"
    fi
}

for e in ${ENGINES:-hmeh pass-dense rophi level pass dashmap hashbrown store}; do
    if [ "$e" = store ]; then
        run store --engine store --workload insert,get-pos
    else
        run "${e//+/-with-}" --engine "$e" --workload insert,get-pos,get-neg
    fi
done
