#!/usr/bin/env python3
"""Moves the keys that adding shards to a twemproxy ring remapped.

    scripts/rebalance.py DIR --old 0,1

DIR/cluster.conf is the cluster's config (see scripts/cluster.sh) after the
new shards were added to it and `scripts/cluster.sh reload DIR` restarted
the proxy with them; --old names the shards that were there before (their
0-based positions in the file). Ketama only moves keys from old shards to
new ones, so for each key of each old shard (SCAN straight to it) the
script asks the proxy: a key the proxy cannot find has moved. It is
written through the proxy with SET NX (a client that wrote it through the
proxy since then keeps its newer value) and deleted at the old shard.
Keys that did not move are not written. Finally it checks that the
shards together hold as many keys as before and that every key it saw
reads back through the proxy, and exits 1 if not.

Needs redis-py (`pip install redis`). Run it while clients are quiet:
a key deleted through the proxy during the move may come back from its
old shard's copy, and the final count assumes no client adds or deletes.
"""

import argparse
import inspect
import sys

import redis

BATCH = 1000


def parse_conf(path):
    proxy, shards = None, []
    with open(path) as f:
        for line in f:
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if words[0] == "proxy":
                proxy = words[1]
            elif words[0] == "server":
                shards.append(words[1])
    if proxy is None or not shards:
        sys.exit(f"rebalance.py: {path} needs a proxy line and server lines")
    return proxy, shards


def connect(addr):
    host, port = addr.rsplit(":", 1)
    # RESP2 and no CLIENT SETINFO on connect: the proxy forwards neither
    # HELLO nor CLIENT and closes the connection instead. Each redis-py
    # version names these options differently (4.x has none of them).
    known = inspect.signature(redis.Redis.__init__).parameters
    quiet = {"protocol": 2} if "protocol" in known else {}
    if "driver_info" in known:
        quiet["driver_info"] = None
    elif "lib_name" in known:
        quiet.update(lib_name=None, lib_version=None)
    return redis.Redis(host=host, port=int(port), socket_timeout=30, **quiet)


def dbsize(addr):
    return connect(addr).dbsize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the cluster's directory (holds cluster.conf)")
    ap.add_argument("--old", required=True, help="the shards there before, e.g. 0,1")
    args = ap.parse_args()
    proxy_addr, shards = parse_conf(f"{args.dir}/cluster.conf")
    old = sorted({int(i) for i in args.old.split(",")})
    if not old or old[-1] >= len(shards) or len(old) == len(shards):
        sys.exit(f"rebalance.py: --old {args.old} must name some, not all, of {len(shards)} shards")

    before = sum(dbsize(a) for a in shards)
    proxy = connect(proxy_addr)
    seen, moved, kept_newer = 0, 0, 0
    for n in old:
        src = connect(shards[n])
        cursor = 0
        while True:
            # One page of the old shard's keys, then their values there and
            # what the proxy finds for them now.
            cursor, keys = src.scan(cursor=cursor, count=BATCH)
            if keys:
                here = src.mget(keys)
                p = proxy.pipeline(transaction=False)
                for k in keys:
                    p.exists(k)
                there = p.execute()
                gone = [(k, v) for k, v, t in zip(keys, here, there) if not t and v is not None]
                if gone:
                    p = proxy.pipeline(transaction=False)
                    for k, v in gone:
                        p.set(k, v, nx=True)
                    for ok in p.execute():
                        kept_newer += 0 if ok else 1
                    # persist: the copy at the new owner is acknowledged
                    # (durable with --durability strict) before the source
                    # copy is deleted, so a crash in between leaves two
                    # copies, never none.
                    src.delete(*[k for k, _ in gone])
                seen += len(keys)
                moved += len(gone)
            if cursor == 0:
                break
        print(f"shard {n} ({shards[n]}): scanned, {moved} moved so far")

    after = sum(dbsize(a) for a in shards)
    split = [dbsize(a) for a in shards]
    print(f"rebalance: {seen} keys seen on the old shards, {moved} moved "
          f"({100.0 * moved / max(seen, 1):.1f}%), {kept_newer} already rewritten by clients; "
          f"keys before {before}, after {after}; split {split}")
    if after != before:
        print("rebalance: FAILED: the shards hold a different number of keys", file=sys.stderr)
        return 1
    # Every key reads back through the proxy: walk each shard again and
    # ask the proxy for every key found.
    missing = 0
    for a in shards:
        keys = list(connect(a).scan_iter(count=BATCH))
        for i in range(0, len(keys), BATCH):
            p = proxy.pipeline(transaction=False)
            for k in keys[i:i + BATCH]:
                p.exists(k)
            missing += sum(1 for found in p.execute() if not found)
    if missing:
        print(f"rebalance: FAILED: {missing} keys are on a shard the proxy does not map them to",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
