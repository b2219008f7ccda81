#!/usr/bin/env bash
# redis-benchmark (GET/SET, 50 clients, pipelined and not) against
# `pmhash serve` (strict durability) and against redis-server on the same
# machine in the same run: without persistence, and with
# `appendonly yes` + `appendfsync always` (the durable comparison).
# Needs redis-tools and redis-server (Debian packages). Usage:
#   scripts/serve-vs-redis.sh [REQUESTS]   (default 200000)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200000}
cargo build --release -q -p pmhash
work=$(mktemp -d /dev/shm/pmhash-serve-bench.XXXXXX)
trap 'redis-cli -p 6391 shutdown nosave >/dev/null 2>&1 || true; redis-cli -p 6392 shutdown nosave >/dev/null 2>&1 || true; redis-cli -p 6390 shutdown >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

target/release/pmhash serve --dir "$work/pmhash" --addr 127.0.0.1:6390 >"$work/pmhash.log" 2>&1 &
redis-server --port 6391 --save '' --appendonly no --dir "$work" --daemonize yes >/dev/null
# The AOF goes to disk (/var/tmp): on tmpfs an fsync costs nothing and
# would make "always" meaningless.
aof=$(mktemp -d /var/tmp/pmhash-aof.XXXXXX)
trap 'redis-cli -p 6391 shutdown nosave >/dev/null 2>&1 || true; redis-cli -p 6392 shutdown nosave >/dev/null 2>&1 || true; redis-cli -p 6390 shutdown >/dev/null 2>&1 || true; rm -rf "$work" "$aof"' EXIT
redis-server --port 6392 --save '' --appendonly yes --appendfsync always --dir "$aof" --daemonize yes >/dev/null
for p in 6390 6391 6392; do
  for _ in $(seq 100); do redis-cli -p $p ping >/dev/null 2>&1 && break; sleep 0.1; done
done

echo "| server | pipeline | SET req/s | GET req/s |"
echo "|---|---|---|---|"
for p in 6390 6391 6392; do
  case $p in
    6390) name="pmhash serve (strict)";;
    6391) name="redis-server, no persistence";;
    6392) name="redis-server, appendfsync always (AOF on disk)";;
  esac
  for pipe in 1 16; do
    out=$(redis-benchmark -p $p -t set,get -n "$n" -c 50 -P $pipe -r 100000 -q 2>/dev/null | tr '\r' '\n' | grep "requests per second")
    set_rps=$(echo "$out" | awk '/^SET/ {print $2}')
    get_rps=$(echo "$out" | awk '/^GET/ {print $2}')
    echo "| $name | $pipe | $set_rps | $get_rps |"
  done
done
