#!/usr/bin/env bash
# redis-benchmark (GET/SET, 50 clients, pipelined and not) against
# `pmhash serve` (strict durability; the default event loops, one per CPU
# less one, and two loops) and against redis-server on the same machine in the same run:
# without persistence, and with `appendonly yes` + `appendfsync always`
# (the durable comparison). Each cell is the median of RUNS runs of
# REQUESTS requests over 100k random keys; all runs are printed too.
# Needs redis-tools and redis-server (Debian packages). Usage:
#   scripts/serve-vs-redis.sh [REQUESTS] [RUNS]   (default 200000 5)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200000}
runs=${2:-5}
cargo build --release -q -p pmhash-cli
work=$(mktemp -d /dev/shm/pmhash-serve-bench.XXXXXX)
# The AOF goes to disk (/var/tmp): on tmpfs an fsync costs nothing and
# would make "always" meaningless.
aof=$(mktemp -d /var/tmp/pmhash-aof.XXXXXX)
cleanup() {
  for p in 6390 6393; do redis-cli -p $p shutdown >/dev/null 2>&1 || true; done
  for p in 6391 6392; do redis-cli -p $p shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$work" "$aof"
}
trap cleanup EXIT

target/release/pmhash serve --dir "$work/pmhash" --addr 127.0.0.1:6390 >"$work/pmhash.log" 2>&1 &
target/release/pmhash serve --dir "$work/pmhash2" --addr 127.0.0.1:6393 --threads 2 >"$work/pmhash2.log" 2>&1 &
redis-server --port 6391 --save '' --appendonly no --dir "$work" --daemonize yes >/dev/null
redis-server --port 6392 --save '' --appendonly yes --appendfsync always --dir "$aof" --daemonize yes >/dev/null
for p in 6390 6391 6392 6393; do
  for _ in $(seq 100); do redis-cli -p $p ping >/dev/null 2>&1 && break; sleep 0.1; done
done

# The runs are interleaved: every run of a (test, pipeline) cell goes to
# each server in turn, so a drift of the machine's speed over the minutes
# of the script (redis alone moved by a fifth between runs) falls on all
# servers alike. Every server still sees the cells in the same order: SET
# and GET unpipelined, then SET and GET pipelined.
ports="6390 6393 6391 6392"
res=$(mktemp)
for pipe in 1 16; do
  for t in set get; do
    for _ in $(seq "$runs"); do
      for p in $ports; do
        r=$(redis-benchmark -p "$p" -t "$t" -n "$n" -c 50 -P "$pipe" -r 100000 -q 2>/dev/null |
          tr '\r' '\n' | awk '/requests per second/ {printf "%d", $2}')
        echo "$p $pipe $t $r" >>"$res"
      done
    done
  done
done

# One cell: median and all runs of test $3 at pipeline $2 against port $1.
cell() {
  local all med
  all=$(awk -v p="$1" -v pipe="$2" -v t="$3" '$1 == p && $2 == pipe && $3 == t {print $4}' "$res" | sort -n)
  med=$(echo "$all" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  echo "$med ($(echo "$all" | tr '\n' ' ' | sed 's/ $//'))"
}

echo "| server | pipeline | SET req/s, median (runs) | GET req/s, median (runs) |"
echo "|---|---|---|---|"
for p in $ports; do
  case $p in
    6390) name="pmhash serve (strict), default loops";;
    6393) name="pmhash serve (strict), --threads 2";;
    6391) name="redis-server, no persistence";;
    6392) name="redis-server, appendfsync always (AOF on disk)";;
  esac
  for pipe in 1 16; do
    echo "| $name | $pipe | $(cell $p $pipe set) | $(cell $p $pipe get) |"
  done
done
rm -f "$res"
