#!/usr/bin/env bash
# Paired runs for ratios on a noisy 2-vCPU host: A and B run at the same
# time, each pinned to its own vCPU (swapped every round), so a slow spell
# of the host hits both. One thread each; for single-thread ratios only
# (the two runs share the L3 and the memory bus, evenly).
#
#   scripts/paired.sh A B WORKLOAD KEYS OPS ROUNDS
#
# A and B are each `BINARY:ENGINE` (for two builds) or `ENGINE` (the
# binary in PMHASH, default target/release/pmhash). Prints each side's
# Mops/s per round, and A/B per round with the median.
set -euo pipefail

a=$1
b=$2
workload=$3
keys=$4
ops=$5
rounds=$6
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

split() { # SIDE -> "BINARY ENGINE"
    if [[ $1 == *:* ]]; then echo "${1%%:*} ${1#*:}"; else echo "${PMHASH:-target/release/pmhash} $1"; fi
}
read -r bin_a eng_a <<<"$(split "$a")"
read -r bin_b eng_b <<<"$(split "$b")"

mops() { # FILE ENGINE -> the run's Mops/s
    awk -v e="$2" '$1==e && $4 ~ /^[0-9.]+$/ && $4+0>0 {print $4; exit}' "$1"
}

ra=()
rb=()
for r in $(seq 1 "$rounds"); do
    taskset -c $((r % 2)) "$bin_a" bench --engine "$eng_a" --workload "$workload" \
        --keys "$keys" --ops "$ops" --threads 1 >"$out/a.txt" 2>&1 &
    pa=$!
    taskset -c $(((r + 1) % 2)) "$bin_b" bench --engine "$eng_b" --workload "$workload" \
        --keys "$keys" --ops "$ops" --threads 1 >"$out/b.txt" 2>&1 &
    pb=$!
    wait "$pa" "$pb"
    ra+=("$(mops "$out/a.txt" "$eng_a")")
    rb+=("$(mops "$out/b.txt" "$eng_b")")
done

python3 - "$a" "$b" "${ra[*]}" "${rb[*]}" <<'PY'
import statistics, sys
a, b, xs, ys = sys.argv[1:5]
xs = [float(x) for x in xs.split()]
ys = [float(y) for y in ys.split()]
q = [x / y for x, y in zip(xs, ys)]
print(f"{a}: " + " ".join(f"{x:.2f}" for x in xs) + f"  median {statistics.median(xs):.2f}")
print(f"{b}: " + " ".join(f"{y:.2f}" for y in ys) + f"  median {statistics.median(ys):.2f}")
print(f"A/B: " + " ".join(f"{r:.3f}" for r in q) + f"  median {statistics.median(q):.3f}")
PY
