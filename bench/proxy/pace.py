#!/usr/bin/env python3
"""bench/proxy/pace.py: paced keep-alive clients for the stale-connection race.

Usage: pace.py PORT CONNECTIONS SECONDS MIN_MS MAX_MS

Each of CONNECTIONS threads keeps one keep-alive connection to 127.0.0.1:PORT and
loops: GET /, read the whole response, sleep a uniform random MIN_MS..MAX_MS. With
the upstream closing connections idle for about that long, the proxy's pooled
connections are closed by the upstream just as requests are sent on them. A closed
client connection is reopened (and counted). Prints one JSON object: requests,
responses by status, and errors (client connection closed without a response, or
timed out) by kind.
"""

import json
import random
import socket
import sys
import threading
import time

REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"


def read_response(s, buf):
    """Reads one response from s (buf: bytes already read). Returns (status, rest)."""
    while b"\r\n\r\n" not in buf:
        data = s.recv(65536)
        if not data:
            raise ConnectionError("closed before the head")
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
        if name.strip().lower() == b"transfer-encoding":
            raise ConnectionError("chunked response not expected from the canned upstream")
    while len(rest) < length:
        data = s.recv(65536)
        if not data:
            raise ConnectionError("closed mid-body")
        rest += data
    return status, rest[length:]


def client(port, deadline, min_ms, max_ms, counts, lock):
    s, buf = None, b""
    local = {"requests": 0, "errors": 0, "reconnects": 0, "status": {}, "kinds": {}}
    while time.monotonic() < deadline:
        try:
            if s is None:
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                local["reconnects"] += 1
                buf = b""
            s.sendall(REQUEST)
            status, buf = read_response(s, buf)
            local["requests"] += 1
            local["status"][status] = local["status"].get(status, 0) + 1
        except (OSError, ConnectionError, ValueError, IndexError) as e:
            local["requests"] += 1
            local["errors"] += 1
            kind = type(e).__name__
            local["kinds"][kind] = local["kinds"].get(kind, 0) + 1
            if s is not None:
                s.close()
            s = None
        time.sleep(random.uniform(min_ms, max_ms) / 1000)
    if s is not None:
        s.close()
    with lock:
        counts["requests"] += local["requests"]
        counts["errors"] += local["errors"]
        counts["reconnects"] += local["reconnects"]
        for k, v in local["status"].items():
            counts["status"][str(k)] = counts["status"].get(str(k), 0) + v
        for k, v in local["kinds"].items():
            counts["kinds"][k] = counts["kinds"].get(k, 0) + v


def main():
    port, conns, secs, min_ms, max_ms = (int(a) for a in sys.argv[1:6])
    counts = {"requests": 0, "errors": 0, "reconnects": 0, "status": {}, "kinds": {}}
    lock = threading.Lock()
    deadline = time.monotonic() + secs
    threads = [
        threading.Thread(target=client, args=(port, deadline, min_ms, max_ms, counts, lock))
        for _ in range(conns)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(counts, sort_keys=True))


if __name__ == "__main__":
    main()
