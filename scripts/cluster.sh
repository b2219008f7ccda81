#!/usr/bin/env bash
# Runs `pmhash serve` shards behind twemproxy (Debian's `nutcracker`):
# keys are hashed onto the shards with ketama consistent hashing, and a
# shard that stops answering is ejected until it answers again.
#
#     scripts/cluster.sh up      DIR   # starts every shard, then the proxy
#     scripts/cluster.sh down    DIR   # stops the proxy, then the shards (SIGTERM: a clean close)
#     scripts/cluster.sh kill    DIR N # SIGKILLs shard N (0-based), as a crash would
#     scripts/cluster.sh start   DIR N # starts shard N again on its address and data
#     scripts/cluster.sh reload  DIR   # after editing cluster.conf: starts new shards, restarts the proxy
#     scripts/cluster.sh status  DIR   # each process: running or not
#
# Adding shards: add their server lines, run `reload`, then
# `scripts/rebalance.py DIR --old 0,1,...` to move the keys the ring now
# maps to them (docs/scale-out.md).
#
# DIR/cluster.conf names the processes, one per line (# starts a comment):
#
#     proxy  127.0.0.1:22121          # where clients connect
#     stats  127.0.0.1:22222          # nutcracker's stats port (optional: the proxy's port + 1)
#     server 127.0.0.1:7001 /data/s0  # a shard: its address and its data directory
#     server 127.0.0.1:7002 /data/s1
#     serve-args --durability strict  # optional: more arguments for every `pmhash serve`
#
# The addresses may be other machines' if this script runs on each (a shard
# whose address is not local is not started here). The proxy's config is
# written to DIR/nutcracker.yml; logs and pid files go to DIR. PMHASH names
# the binary (default: target/release/pmhash of this checkout).
# START_TIMEOUT bounds, in seconds, the wait for each process started to
# serve (default 300).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
PMHASH=${PMHASH:-$here/target/release/pmhash}
NUTCRACKER=${NUTCRACKER:-nutcracker}

usage() { sed -n '5,11p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1 dir=$2
conf=$dir/cluster.conf
[ -f "$conf" ] || { echo "cluster.sh: $conf is missing" >&2; exit 2; }

proxy="" stats="" serve_args=() servers=() datas=()
while read -r kind a b rest; do
  case "$kind" in
    ''|'#'*) ;;
    proxy) proxy=$a ;;
    stats) stats=$a ;;
    server) [ -n "$b" ] || { echo "cluster.sh: 'server $a' needs a data directory" >&2; exit 2; }
            servers+=("$a"); datas+=("$b") ;;
    serve-args) read -r -a serve_args <<< "$a $b $rest" ;;
    *) echo "cluster.sh: unknown line '$kind' in $conf" >&2; exit 2 ;;
  esac
done < "$conf"
[ -n "$proxy" ] || { echo "cluster.sh: $conf names no proxy" >&2; exit 2; }
[ ${#servers[@]} -gt 0 ] || { echo "cluster.sh: $conf names no server" >&2; exit 2; }
[ -n "$stats" ] || stats=${proxy%:*}:$(( ${proxy##*:} + 1 ))

is_local() {
  case "${1%:*}" in 127.*|localhost|0.0.0.0) return 0 ;; esac
  hostname -I 2>/dev/null | tr ' ' '\n' | grep -qx "${1%:*}"
}

# Whether PID is a live process (a zombie, dead but not yet reaped, is not).
alive() { kill -0 "$1" 2>/dev/null && [ "$(ps -o stat= -p "$1" | cut -c1)" != Z ]; }
running() { [ -f "$1" ] && alive "$(cat "$1")"; }

# Waits until a process started here serves, and fails at once, with the
# end of LOG, if process PID exits first. `pmhash serve` binds its address
# before it opens its store, and the kernel accepts connections from then
# on, so a shard serves once it prints `pmhash serve: listening on` (after
# its store is open) to LOG past byte FROM: its own line, which no other
# process on the address can fake. The proxy serves once ADDR accepts
# (FROM empty). START_TIMEOUT (seconds, default 300) bounds the wait:
# opening a large store after a crash scans its logs.
wait_ready() {
  local addr=$1 what=$2 pid=$3 log=$4 from=$5 seen
  local deadline=$((SECONDS + ${START_TIMEOUT:-300}))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if [ -n "$from" ]; then
      # grep -c reads to the end: grep -q could close the pipe early, and
      # tail's SIGPIPE would fail the pipeline (pipefail).
      seen=$(tail -c +$((from + 1)) "$log" 2>/dev/null | grep -c '^pmhash serve: listening on' || true)
      [ "${seen:-0}" -gt 0 ] && return 0
    elif (exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}") 2>/dev/null && alive "$pid"; then
      return 0
    fi
    if ! alive "$pid"; then
      echo "cluster.sh: $what exited before serving on $addr:" >&2
      tail -n 5 "$log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "cluster.sh: $what did not serve on $addr within ${START_TIMEOUT:-300} s" >&2
  return 1
}

start_server() {
  local n=$1 addr=${servers[$1]} data=${datas[$1]}
  is_local "$addr" || return 0
  if running "$dir/server$n.pid"; then return 0; fi
  mkdir -p "$data"
  local from
  from=$(stat -c %s "$dir/server$n.log" 2>/dev/null || echo 0)
  "$PMHASH" serve --dir "$data" --addr "$addr" "${serve_args[@]}" \
    >> "$dir/server$n.log" 2>&1 < /dev/null &
  echo $! > "$dir/server$n.pid"
  wait_ready "$addr" "shard $n ($PMHASH serve)" "$!" "$dir/server$n.log" "$from"
}

write_proxy_config() {
  {
    echo "pmhash:"
    echo "  listen: $proxy"
    echo "  hash: fnv1a_64"
    echo "  distribution: ketama"
    echo "  redis: true"
    # A shard that fails once is ejected for 2 s, then tried again: the
    # other shards' keys are served meanwhile, and its own keys go to the
    # next shard on the ring (see docs/scale-out.md on what that means).
    echo "  auto_eject_hosts: true"
    echo "  server_failure_limit: 1"
    echo "  server_retry_timeout: 2000"
    echo "  timeout: 2000"
    echo "  preconnect: false"
    echo "  servers:"
    local n
    for n in "${!servers[@]}"; do
      # The name (not the address) places the shard on the ring, so a
      # shard keeps its keys when it moves to another address.
      echo "   - ${servers[$n]}:1 shard$n"
    done
  } > "$dir/nutcracker.yml"
}

stop_proxy() {
  if running "$dir/nutcracker.pid"; then
    local pid
    pid=$(cat "$dir/nutcracker.pid")
    kill "$pid"
    for _ in $(seq 1 300); do alive "$pid" || break; sleep 0.1; done
  fi
  rm -f "$dir/nutcracker.pid"
}

case "$cmd" in
  up|reload)
    for n in "${!servers[@]}"; do start_server "$n"; done
    write_proxy_config
    "$NUTCRACKER" --test-conf -c "$dir/nutcracker.yml" > "$dir/nutcracker-test.log" 2>&1 \
      || { cat "$dir/nutcracker-test.log" >&2; exit 1; }
    # nutcracker reads its config once: a new ring needs a new process.
    [ "$cmd" = up ] || stop_proxy
    if ! running "$dir/nutcracker.pid"; then
      "$NUTCRACKER" -c "$dir/nutcracker.yml" -o "$dir/nutcracker.log" \
        -s "${stats##*:}" -a "${stats%:*}" < /dev/null > /dev/null 2>&1 &
      echo $! > "$dir/nutcracker.pid"
    fi
    wait_ready "$proxy" "nutcracker" "$(cat "$dir/nutcracker.pid")" "$dir/nutcracker.log" ""
    echo "cluster.sh: ${#servers[@]} shards behind $proxy"
    ;;
  down)
    stop_proxy
    for n in "${!servers[@]}"; do
      if running "$dir/server$n.pid"; then
        pid=$(cat "$dir/server$n.pid")
        kill "$pid"
        # The server closes its store cleanly on SIGTERM; wait for that.
        for _ in $(seq 1 300); do alive "$pid" || break; sleep 0.1; done
      fi
      rm -f "$dir/server$n.pid"
    done
    ;;
  kill)
    [ $# -ge 3 ] || usage
    running "$dir/server$3.pid" || { echo "cluster.sh: shard $3 is not running" >&2; exit 1; }
    pid=$(cat "$dir/server$3.pid")
    kill -9 "$pid"
    for _ in $(seq 1 300); do alive "$pid" || break; sleep 0.1; done
    rm -f "$dir/server$3.pid"
    ;;
  start)
    [ $# -ge 3 ] || usage
    [ "$3" -lt "${#servers[@]}" ] || { echo "cluster.sh: there is no shard $3" >&2; exit 2; }
    start_server "$3"
    ;;
  status)
    for n in "${!servers[@]}"; do
      if running "$dir/server$n.pid"; then s=running; else s=stopped; fi
      echo "shard$n ${servers[$n]} $s"
    done
    if running "$dir/nutcracker.pid"; then s=running; else s=stopped; fi
    echo "proxy $proxy $s"
    ;;
  *) usage ;;
esac
