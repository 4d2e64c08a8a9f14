#!/usr/bin/env python3
"""bench/failover/slow.py PORT DELAY_MS: a slow application server for the balancing
figure. HTTP/1.1 keep-alive, one thread per connection; every request is answered
after DELAY_MS with 1 KiB, except `GET /__count`, answered at once with the number of
slow responses so far (the share a proxy sent it). Prints "ready" once listening."""
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, DELAY = int(sys.argv[1]), int(sys.argv[2]) / 1000.0
BODY = bytes(range(256)) * 4
served = 0
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        global served
        if self.path == "/__count":
            body = str(served).encode()
        else:
            time.sleep(DELAY)
            with lock:
                served += 1
            body = BODY
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024


server = Server(("127.0.0.1", PORT), Handler)
print("ready", flush=True)
server.serve_forever()
