"""redis-py's own pipeline and transaction helpers against pmhash serve.

Run by tests/hostile.rs as `python3 redis_py_transactions.py PORT`; prints
a last line saying every check passed, or fails with the first that did
not.
"""

import sys
import threading

import redis


def main(port: int) -> None:
    r = redis.Redis(host="127.0.0.1", port=port)
    r.delete("p:a", "p:b", "p:counter", "p:text")

    # pipeline() wraps its commands in MULTI/EXEC by default.
    with r.pipeline() as p:
        p.set("p:a", 1).incr("p:a").get("p:a").mset({"p:b": "x", "p:text": "t"})
        assert p.execute() == [True, 2, b"2", True], "pipeline results"
    assert r.get("p:a") == b"2" and r.get("p:b") == b"x"

    # A runtime error inside the transaction is that command's result.
    with r.pipeline() as p:
        p.incr("p:text").set("p:a", 5)
        res = p.execute(raise_on_error=False)
        assert isinstance(res[0], redis.ResponseError) and res[1] is True, res
    assert r.get("p:a") == b"5"

    # A queued syntax error aborts the whole transaction.
    with r.pipeline() as p:
        p.set("p:a", 6)
        p.execute_command("GET")  # wrong number of arguments
        try:
            p.execute()
            raise AssertionError("EXECABORT expected")
        except redis.ResponseError as e:
            assert "EXECABORT" in str(e) or "wrong number" in str(e), e
    assert r.get("p:a") == b"5", "nothing of an aborted transaction applied"

    # Without a transaction, a plain pipeline.
    with r.pipeline(transaction=False) as p:
        p.set("p:c", 1).get("p:c")
        assert p.execute() == [True, b"1"]

    # transaction(): WATCH, read, MULTI, write, EXEC, retried on conflict.
    r.set("p:counter", 0)
    per_thread, threads = 50, 4

    def bump(pipe):
        cur = int(pipe.get("p:counter"))
        pipe.multi()
        pipe.set("p:counter", cur + 1)

    def worker():
        c = redis.Redis(host="127.0.0.1", port=port)
        for _ in range(per_thread):
            c.transaction(bump, "p:counter")

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    got = int(r.get("p:counter"))
    assert got == per_thread * threads, f"counter {got}: a lost update got through WATCH"

    # A watched key written by someone else fails the pipeline with WatchError.
    with r.pipeline() as p:
        p.watch("p:a")
        r.set("p:a", 7)
        p.multi()
        p.set("p:a", 8)
        try:
            p.execute()
            raise AssertionError("WatchError expected")
        except redis.WatchError:
            pass
    assert r.get("p:a") == b"7"
    print("redis-py transactions: all checks passed")


if __name__ == "__main__":
    main(int(sys.argv[1]))
