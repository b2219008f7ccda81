#!/usr/bin/env bash
# YCSB workloads A and C through twemproxy in front of three `pmhash serve`
# shards (scripts/cluster.sh), with every read verified
# (dataintegrity=true). Fails unless every operation returned OK.
#
#     ycsb/through-proxy.sh                    # 100,000 records and operations
#     RECORDS=20000 OPS=20000 ycsb/through-proxy.sh
#
# Needs Java 17, Maven (the first build downloads YCSB core and Jedis from
# Maven Central), nutcracker and a built pmhash (PMHASH, default
# target/release/pmhash). Prints one line per phase.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
RECORDS=${RECORDS:-100000}
OPS=${OPS:-100000}
THREADS=${THREADS:-2}
export PMHASH=${PMHASH:-$root/target/release/pmhash}

if [ ! -f "$here/target/pmhash-ycsb-binding.jar" ]; then
  (cd "$here" && mvn -q -B ${MVN_FLAGS:-} package -DskipTests)
fi
CP="$here/target/pmhash-ycsb-binding.jar:$here/target/dependency/*"

# Five distinct ports nothing listens on.
ports=()
while [ ${#ports[@]} -lt 5 ]; do
  p=$((20000 + RANDOM % 40000))
  case " ${ports[*]} " in *" $p "*) continue ;; esac
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then ports+=("$p"); fi
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/pmhash-ycsb-proxy.XXXXXX")
cleanup() { "$root/scripts/cluster.sh" down "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
{
  echo "proxy 127.0.0.1:${ports[0]}"
  echo "stats 127.0.0.1:${ports[1]}"
  for n in 0 1 2; do echo "server 127.0.0.1:${ports[$((n + 2))]} $dir/data$n"; done
  echo "serve-args --durability strict"
} > "$dir/cluster.conf"
"$root/scripts/cluster.sh" up "$dir" >/dev/null

phase() { # $1: -load|-t  $2: workload letter  $3: operation names that must be all OK
  local out="$dir/ycsb-$2$1.txt"
  java ${JAVA_OPTS:-} -cp "$CP" site.ycsb.Client "$1" -db site.ycsb.db.pmhash.PmhashClient \
    -P "$here/workloads/workload$2" -p recordcount="$RECORDS" -p operationcount="$OPS" \
    -p pmhash.port="${ports[0]}" -p dataintegrity=true -threads "$THREADS" -s > "$out" 2>&1
  local want total=0 op n
  [ "$1" = -load ] && want=$RECORDS || want=$OPS
  for op in $3; do
    n=$(sed -n "s/^\[$op\], Return=OK, \([0-9]*\)$/\1/p" "$out")
    total=$((total + ${n:-0}))
  done
  if [ "$total" -ne "$want" ] || grep -q "Return=\(ERROR\|NOT_FOUND\|UNEXPECTED_STATE\)" "$out"; then
    echo "through-proxy.sh: workload $2 $1: $total of $want operations OK" >&2
    grep -E "Return=|Exception" "$out" | head -20 >&2
    exit 1
  fi
  local name=run
  [ "$1" = -load ] && name=load
  echo "workload $2 $name: $want operations OK, $(sed -n 's/^\[OVERALL\], Throughput(ops\/sec), \([0-9]*\).*/\1/p' "$out") ops/s"
}

phase -load a "INSERT"
phase -t a "READ UPDATE"
phase -t c "READ"
echo "shards hold: $(for n in 2 3 4; do redis-cli -p "${ports[$n]}" dbsize; done | paste -sd' ')"
