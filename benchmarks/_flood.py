"""The flood of ``connection_flood.py``, in a process of its own: one local user's connections.

``python benchmarks/_flood.py HOST:PORT N MODE`` raises its open-file limit to the hard one and
opens ``N`` TCP connections to the master one after the other, as fast as it can. With MODE
``preface`` each sends the HTTP/2 client preface and an empty SETTINGS frame (what a gRPC
client sends first: the master's transport is then set up and kept, as for a real client);
with ``tcp`` it sends nothing. It prints one JSON line once they are open, then watches them:
what the master sends is read and dropped, and a connection the master closes (past its cap
at once, an idle one after its idle close) is counted with the time it went. On ``close`` on
stdin it closes the ones left and prints a second JSON line, and exits.

Times are on the monotonic clock (shared by every process of the machine), so the script that
started this one can place them beside its own.
"""

from __future__ import annotations

import json
import resource
import selectors
import socket
import sys
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + SETTINGS, empty


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 2**20
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def main() -> None:
    address, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    host, port = address.rsplit(":", 1)
    _raise_fd_limit()
    sel = selectors.DefaultSelector()
    opened: dict[socket.socket, float] = {}
    failed = 0
    first = time.monotonic()
    for _ in range(n):
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            if mode == "preface":
                s.sendall(PREFACE)
            s.setblocking(False)
        except OSError:
            failed += 1
            continue
        opened[s] = time.monotonic()
        sel.register(s, selectors.EVENT_READ)
    last = time.monotonic()
    print(
        json.dumps({"opened": len(opened), "failed": failed, "first": first, "last": last}),
        flush=True,
    )
    sel.register(sys.stdin, selectors.EVENT_READ)
    closed: list[tuple[float, float]] = []  # (when the master closed it, its age then)
    done = False
    while not done:
        for key, _ in sel.select(timeout=1.0):
            if key.fileobj is sys.stdin:
                done = True  # "close", or the parent gone
                continue
            s = key.fileobj
            assert isinstance(s, socket.socket)
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                now = time.monotonic()
                closed.append((now, now - opened.pop(s)))
                sel.unregister(s)
                s.close()
    held = len(opened)
    for s in opened:
        s.close()
    print(json.dumps({"closed_by_master": closed, "closed_by_us": held, "at": time.monotonic()}), flush=True)


if __name__ == "__main__":
    main()
