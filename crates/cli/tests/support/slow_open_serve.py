#!/usr/bin/env python3
"""A stand-in for `pmhash serve --dir D --addr HOST:PORT ...` whose store
takes OPEN_SECONDS (default 1.5) to open: like the real server it binds and
listens at once, so the kernel accepts connections from then on, but it
answers nothing until the store is open. Then it writes D/opened and
answers every request line with +PONG. SIGTERM ends it."""
import os
import socket
import sys
import threading
import time


def serve(conn):
    with conn, conn.makefile("rb") as lines:
        for _ in lines:
            conn.sendall(b"+PONG\r\n")


def main():
    args = sys.argv[1:]
    data = args[args.index("--dir") + 1]
    host, port = args[args.index("--addr") + 1].rsplit(":", 1)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(64)
    time.sleep(float(os.environ.get("OPEN_SECONDS", "1.5")))
    os.makedirs(data, exist_ok=True)
    open(os.path.join(data, "opened"), "w").close()
    print(f"pmhash serve: listening on {host}:{port}", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


main()
