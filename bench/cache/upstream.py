#!/usr/bin/env python3
"""bench/cache/upstream.py: the application behind the caches of bench/cache/run.

Usage: upstream.py PORT LOG

A threaded HTTP/1.1 server (stdlib, a thread per connection, keep-alive) whose
answer is set by the query of each GET:

    size=N    body bytes (default 1024): the request's path and `|`, repeated, cut
              to N (so a client can tell one key's body from another's)
    ttl=S     `Cache-Control: max-age=S` (default 3600)
    delay=MS  the answer comes this long after the request (default 0)
    date=early  `Date` is taken when the request comes, before the delay (as an
              application that stamps it first); by default just before sending

Every response has `ETag: "<size>-<path>"`; a request whose `If-None-Match` is that
tag gets a 304 (after the same delay). `/__probe` answers 200 `ok` at once (a health
probe; not logged). Every other request is appended to LOG as one line
`<unix time> <status> <target>` with one write(2) on an O_APPEND file, so the lines
are whole, in order, and on disk when the process is killed: what the caches in front
sent this application is counted from LOG.

Prints "ready" on stdout once listening.
"""

import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


def body_of(path, size):
    unit = path.encode() + b"|"
    return (unit * (size // len(unit) + 1))[:size]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "bench-upstream"
    sys_version = ""

    def log_message(self, *args):
        pass

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/__probe":
            self.answer(200, {"Cache-Control": "no-store"}, b"ok")
            return
        q = parse_qs(url.query)
        size = int(q.get("size", ["1024"])[0])
        ttl = int(q.get("ttl", ["3600"])[0])
        delay = int(q.get("delay", ["0"])[0])
        etag = f'"{size}-{url.path}"'
        status = 304 if self.headers.get("If-None-Match") == etag else 200
        line = f"{time.time():.6f} {status} {self.path}\n".encode()
        os.write(self.server.log_fd, line)
        early = self.date_time_string() if q.get("date") == ["early"] else None
        if delay:
            time.sleep(delay / 1000)
        fields = {"Date": early or self.date_time_string(), "Cache-Control": f"max-age={ttl}", "ETag": etag}
        if status == 304:
            self.answer(304, fields, None)
        else:
            fields["Content-Type"] = "application/octet-stream"
            self.answer(200, fields, body_of(url.path, size))

    def answer(self, status, fields, body):
        self.send_response_only(status)
        fields.setdefault("Date", self.date_time_string())
        for name, value in fields.items():
            self.send_header(name, value)
        if body is not None:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 4096


def main():
    port, log = int(sys.argv[1]), sys.argv[2]
    threading.stack_size(256 * 1024)
    server = Server(("127.0.0.1", port), Handler)
    server.log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
