#!/usr/bin/env python3
"""A minimal HTTP relay, for measuring what `splice` would save forkd (issue #23).

Not a proxy: one connection at a time, the request head forwarded as is, the
upstream's response (head and body) relayed to the client until the upstream closes
(gunicorn's sync workers close after every response). It differs between its two
modes only in how response bytes move, so `bench/app-shield/run`'s `cpu` case run
against both (SERVERS="relay-copy relay-splice") shows what the copies cost:

  copy    recv_into a 64 KiB buffer, then send it: the two copies through user
          space a relay makes (forkd's relay, nginx's buffers)
  splice  splice(socket -> pipe) then splice(pipe -> socket), PIPE_KB KiB a call:
          the pages move by reference, no copy through user space

Like forkd and nginx it forks one worker, which serves (the bench measures the
worker: its CPU time from /proc/PID/schedstat).

  relay.py --mode copy|splice --port P --upstream PORT [--pipe-kb 1024]
"""

import argparse
import os
import socket
import sys

CHUNK = 64 * 1024


def read_head(conn):
    """The request head from the client (the whole of what the bench sends)."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(CHUNK)
        if not got:
            return None
        data += got
    return data


def relay_copy(up, client):
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        n = up.recv_into(view)
        if not n:
            return
        client.sendall(view[:n])


def relay_splice(up, client, pipe_bytes):
    r, w = os.pipe()
    try:
        try:
            import fcntl

            fcntl.fcntl(w, 1031, pipe_bytes)  # F_SETPIPE_SZ
        except OSError:
            pass
        up_fd, client_fd = up.fileno(), client.fileno()
        while True:
            n = os.splice(up_fd, w, pipe_bytes, flags=os.SPLICE_F_MOVE)
            if n == 0:
                return
            while n:
                m = os.splice(r, client_fd, n, flags=os.SPLICE_F_MOVE)
                if m == 0:
                    return
                n -= m
    finally:
        os.close(r)
        os.close(w)


def serve(listener, a):
    while True:
        client, _ = listener.accept()
        with client:
            try:
                head = read_head(client)
                if head is None:
                    continue
                with socket.create_connection(("127.0.0.1", a.upstream)) as up:
                    up.sendall(head)
                    if a.mode == "copy":
                        relay_copy(up, client)
                    else:
                        relay_splice(up, client, a.pipe_kb * 1024)
            except OSError:
                pass


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("copy", "splice"), required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", type=int, required=True)
    p.add_argument("--pipe-kb", type=int, default=1024)
    a = p.parse_args()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", a.port))
    listener.listen(128)
    pid = os.fork()
    if pid == 0:
        try:
            os.sched_setaffinity(0, {0})  # CPU 0, as forkd's and nginx's workers
        except OSError:
            pass
        serve(listener, a)
        sys.exit(0)
    listener.close()
    try:
        os.waitpid(pid, 0)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
