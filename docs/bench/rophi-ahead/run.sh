#!/bin/bash
set -u
P=/dev/shm
nproc
one() { # label thr bin
  f=$OUT/r.json
  timeout 120 devbin/$1 bench --engine rophi --keys 10M --threads $2 --workload insert --initial-capacity 64k --no-chart --pool $P --json $f > /dev/null 2>&1 || echo "FAIL $1 $2"
  m=$(grep -o '"mops": [0-9.]*' $f | head -1 | cut -d' ' -f2)
  s=$(grep -o '"structural_ms": [0-9.]*' $f | head -1 | cut -d' ' -f2)
  z=$(grep -o '"resize ms": "[0-9.]*"' $f | head -1 | cut -d'"' -f4)
  a=$(grep -o '"pages faulted in ahead MiB": "[0-9.]*"' $f | head -1 | cut -d'"' -f4)
  echo "$1 thr=$2 mops=$m struct_ms=$s resize_ms=$z ahead_mib=${a:-0}" | tee -a $OUT/summary3.txt
  rm -f $f
}
for thr in 1 2 4 8 16; do for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then one base $thr; one final $thr; else one final $thr; one base $thr; fi
done; done
