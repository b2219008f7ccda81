#!/usr/bin/env bash
# Interleaved rounds of two engines, for ratios on a noisy machine (the
# 2-vCPU hosts drift by 20-40% over minutes, and `pmhash bench` runs its
# engines one after the other: all of the first engine's runs, then all
# of the second's). Each round runs every (workload, threads) cell as its
# own invocation, A then B in odd rounds and B then A in even ones, so a
# slow spell hits both engines of a cell.
#
#   scripts/interleaved.sh A B OUTDIR [ROUNDS]
#
# WORKLOADS (comma-separated, default insert,get-pos), THREADS (space-
# separated, default "1 2"), KEYS (default 2M) and PMHASH (default
# target/release/pmhash) narrow the run; SIZING (default --presized: tables
# sized for KEYS; empty: grown from the engines' default) sizes the tables. Writes OUTDIR/round-R-W-tT.json
# and .txt per cell, then prints each cell's A/B ratios, median and
# minimum (from the JSONs' throughput).
set -euo pipefail

a=$1
b=$2
out=$3
rounds=${4:-5}
bin=${PMHASH:-target/release/pmhash}
workloads=${WORKLOADS:-insert,get-pos}
threads=${THREADS:-1 2}
keys=${KEYS:-2M}
sizing=${SIZING---presized}
mkdir -p "$out"

for r in $(seq 1 "$rounds"); do
    order="$a,$b"
    if [ $((r % 2)) -eq 0 ]; then order="$b,$a"; fi
    for w in ${workloads//,/ }; do
        for t in $threads; do
            base="$out/round-$r-$w-t$t"
            "$bin" bench --engine "$order" --workload "$w" --keys "$keys" --threads "$t" \
                $sizing --json "$base.json" >"$base.txt" 2>&1
        done
    done
done

python3 - "$out" "$a" "$b" <<'EOF'
import glob, json, re, statistics, sys
out, a, b = sys.argv[1:4]
cells = {}
for f in sorted(glob.glob(f"{out}/round-*.json")):
    r, w, t = re.search(r"round-(\d+)-(.+)-t(\d+)\.json$", f).groups()
    runs = json.load(open(f))["runs"]
    got = {x["engine"]: x["mops"] for x in runs}
    if a in got and b in got:
        cells.setdefault((w, int(t)), []).append((int(r), got[a], got[b]))
for (w, t), rows in sorted(cells.items()):
    rows.sort()
    ratios = [x / y for _, x, y in rows]
    print(f"{w:10} {t:2} thr  {a}/{b}: " + " ".join(f"{q:.2f}" for q in ratios)
          + f"  median {statistics.median(ratios):.2f}  min {min(ratios):.2f}"
          + f"  | {a} " + " ".join(f"{x:.2f}" for _, x, _ in rows)
          + f" | {b} " + " ".join(f"{y:.2f}" for _, _, y in rows))
EOF
