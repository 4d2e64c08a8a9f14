#!/usr/bin/env python3
"""bench/http2/idle_conns.py — open N connections to 127.0.0.1:PORT, make one request
on each (GET PATH, checked: 200 and BYTES bytes of body), then keep them all open and
idle until STOP_FILE exists or HOLD seconds have passed.

--proto h2: HTTP/2 (h2c prior knowledge, or ALPN h2 with --tls) through the `h2`
library, whose SETTINGS ACK and WINDOW_UPDATEs are sent as a real client's would.
--proto h1: HTTP/1.1 keep-alive (ALPN http/1.1 with --tls).
Prints "ready N" once all N have had their answer, then the exit summary.
"""
import argparse
import asyncio
import os
import resource
import ssl
import sys
import time

import h2.config
import h2.connection
import h2.events


async def one_h2(a, ctx, stop):
    r, w = await asyncio.open_connection("127.0.0.1", a.port, ssl=ctx,
                                         server_hostname="localhost" if ctx else None)
    if ctx and w.get_extra_info("ssl_object").selected_alpn_protocol() != "h2":
        raise RuntimeError("ALPN did not choose h2")
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    c.initiate_connection()
    if a.no_request:
        c.ping(b"idle-pin")   # the PING's ACK says the server has the preface and SETTINGS
    else:
        c.send_headers(1, [(":method", "GET"), (":scheme", "https" if ctx else "http"),
                           (":authority", "localhost"), (":path", a.path)], end_stream=True)
    w.write(c.data_to_send())
    status, body, done = None, 0, False
    while not done:
        data = await r.read(65536)
        if not data:
            raise RuntimeError("closed before the answer")
        for ev in c.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                status = dict(ev.headers).get(b":status")
            elif isinstance(ev, h2.events.DataReceived):
                body += len(ev.data)
                c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                done = True
            elif isinstance(ev, h2.events.PingAckReceived) and a.no_request:
                done = True
        w.write(c.data_to_send())
    if not a.no_request and (status != b"200" or body != a.bytes):
        raise RuntimeError(f"status {status} body {body}")
    # Idle: answer what the server may send (PING, SETTINGS) until told to stop.
    async def pump():
        while True:
            data = await r.read(65536)
            if not data:
                return "closed by the server"
            c.receive_data(data)
            w.write(c.data_to_send())
    return w, asyncio.ensure_future(pump())


async def one_h1(a, ctx, stop):
    r, w = await asyncio.open_connection("127.0.0.1", a.port, ssl=ctx,
                                         server_hostname="localhost" if ctx else None)
    w.write(f"GET {a.path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    head = await r.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(x.split(":", 1)[1]) for x in lines if x.lower().startswith("content-length:"))
    body = await r.readexactly(length)
    if " 200 " not in lines[0] + " " or len(body) != a.bytes:
        raise RuntimeError(f"{lines[0]} body {len(body)}")

    async def pump():
        data = await r.read(1)
        return "closed by the server" if not data else "unexpected bytes"
    return w, asyncio.ensure_future(pump())


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--proto", choices=["h2", "h1"], required=True)
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--path", default="/1k.bin")
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--hold", type=float, default=120)
    ap.add_argument("--no-request", action="store_true",
                    help="h2: no request, only the preface, SETTINGS and a PING round trip")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, a.n + 100)), hard))
    ctx = None
    if a.tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2" if a.proto == "h2" else "http/1.1"])
    one = one_h2 if a.proto == "h2" else one_h1
    sem = asyncio.Semaphore(32)
    stop = asyncio.Event()

    async def guarded():
        async with sem:
            return await one(a, ctx, stop)
    conns = await asyncio.gather(*(guarded() for _ in range(a.n)))
    print(f"ready {len(conns)}", flush=True)
    deadline = time.monotonic() + a.hold
    while not os.path.exists(a.stop_file) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    lost = [t.result() for _, t in conns if t.done()]
    for w, t in conns:
        t.cancel()
        w.close()
    print(f"closed {len(conns)}; closed by the server while idle: {len(lost)}", flush=True)
    return 0 if not lost else 2


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
