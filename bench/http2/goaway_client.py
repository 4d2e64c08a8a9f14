#!/usr/bin/env python3
"""bench/http2/goaway_client.py — a load client that tells apart what h2load lumps
together as "errored" when a server drains: C connections to 127.0.0.1:PORT (h2c, or
ALPN h2 with --tls), M streams in flight on each (GET PATH, BYTES bytes checked),
reconnecting whenever the server ends a connection (or after --per-conn streams), for
SECONDS.

When a connection ends, each of its unfinished streams is counted as
  refused   its id is above the last GOAWAY's last-stream-id (the server never
            processed it: RFC 9113 §6.8 says a client may retry it), or it was reset
            with REFUSED_STREAM;
  failed    anything else: reset with another code, or cut by the close although the
            GOAWAY covered it (or no GOAWAY came at all).
Prints one JSON line: completed, failed, refused, connections, goaways (last ids and
codes of the first few), closes without GOAWAY, and examples of failures.
"""
import argparse
import asyncio
import json
import ssl
import time

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Stats:
    def __init__(self):
        self.completed = self.failed = self.refused = self.connections = 0
        self.no_goaway_close = 0
        self.goaways = []
        self.examples = []
        self.bad_bodies = 0


def frame(ftype, flags, sid, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([ftype, flags]) + sid.to_bytes(4, "big") + payload


async def run_conn(a, ctx, st, deadline):
    # Frames by hand (the `h2` library treats a received GOAWAY as the end of the
    # connection and raises on the PING of a two-step GOAWAY that follows it).
    r, w = await asyncio.open_connection("127.0.0.1", a.port, ssl=ctx,
                                         server_hostname="localhost" if ctx else None)
    st.connections += 1
    enc, dec = hpack.Encoder(), hpack.Decoder()
    hdrs = [(":method", "GET"), (":scheme", "https" if ctx else "http"),
            (":authority", "localhost"), (":path", a.path)]
    # SETTINGS: a 1 MiB stream window, and the connection window raised to match.
    w.write(PREFACE + frame(4, 0, 0, (4).to_bytes(2, "big") + (1 << 20).to_bytes(4, "big"))
            + frame(8, 0, 0, ((1 << 30) - 65535).to_bytes(4, "big")))
    open_streams = {}   # id -> [status, bytes]
    next_id = 1
    last_id = None      # from the newest GOAWAY
    max_streams = a.m
    buf = b""
    reason = "deadline"

    def fill():
        nonlocal next_id
        out = b""
        while (last_id is None and len(open_streams) < min(a.m, max_streams) and time.monotonic() < deadline
               and not (a.per_conn and next_id > 2 * a.per_conn)):
            out += frame(1, 0x5, next_id, enc.encode(hdrs))
            open_streams[next_id] = [None, 0]
            next_id += 2
        return out

    w.write(fill())
    try:
        while open_streams or (last_id is None and time.monotonic() < deadline
                               and not (a.per_conn and next_id > 2 * a.per_conn)):
            try:
                data = await asyncio.wait_for(r.read(65536), timeout=max(0.1, deadline + 5 - time.monotonic()))
            except asyncio.TimeoutError:
                reason = "timeout"
                break
            if not data:
                reason = "closed"
                break
            buf += data
            out = b""
            consumed = 0
            while len(buf) >= 9:
                ln = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + ln:
                    break
                ft, fl, sid = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                pl = buf[9:9 + ln]
                buf = buf[9 + ln:]
                if ft == 0:   # DATA
                    pad = pl[0] if fl & 0x8 else 0
                    body = len(pl) - (1 + pad if fl & 0x8 else 0)
                    consumed += ln
                    if sid in open_streams:
                        open_streams[sid][1] += body
                        if ln:
                            out += frame(8, 0, sid, ln.to_bytes(4, "big"))
                elif ft == 1:   # HEADERS (no CONTINUATION expected for a 1 KiB GET)
                    p = pl
                    if fl & 0x8:
                        p = p[1:len(p) - p[0]]
                    if fl & 0x20:
                        p = p[5:]
                    for k, v in dec.decode(p, raw=True):
                        if k == b":status" and sid in open_streams:
                            open_streams[sid][0] = v
                elif ft == 3:   # RST_STREAM
                    code = int.from_bytes(pl[:4], "big")
                    if open_streams.pop(sid, None) is not None:
                        if code == 7:
                            st.refused += 1
                        else:
                            st.failed += 1
                            if len(st.examples) < 10:
                                st.examples.append(f"stream {sid} reset, code {code}")
                    continue
                elif ft == 4 and not fl & 1:   # SETTINGS
                    for i in range(0, len(pl), 6):
                        if int.from_bytes(pl[i:i + 2], "big") == 3:
                            max_streams = int.from_bytes(pl[i + 2:i + 6], "big")
                    out += frame(4, 1, 0)
                elif ft == 6 and not fl & 1:   # PING
                    out += frame(6, 1, 0, pl)
                elif ft == 7:   # GOAWAY
                    last_id = int.from_bytes(pl[:4], "big") & 0x7FFFFFFF
                    code = int.from_bytes(pl[4:8], "big")
                    if len(st.goaways) < 20:
                        st.goaways.append((last_id, code))
                    for s2 in [s for s in open_streams if s > last_id]:
                        del open_streams[s2]
                        st.refused += 1
                if fl & 0x1 and ft in (0, 1) and sid in open_streams:   # END_STREAM
                    status, n = open_streams.pop(sid)
                    if status == b"200" and n == a.bytes:
                        st.completed += 1
                    else:
                        st.failed += 1
                        if len(st.examples) < 10:
                            st.examples.append(f"stream {sid}: status {status} {n} bytes")
            if consumed:
                out += frame(8, 0, 0, consumed.to_bytes(4, "big"))
            out += fill()
            if out:
                w.write(out)
    except (ConnectionError, OSError) as e:
        reason = f"socket error {e}"
    if last_id is None and open_streams and reason != "deadline":
        st.no_goaway_close += 1
    for sid in list(open_streams):
        st.failed += 1
        if len(st.examples) < 10:
            st.examples.append(f"stream {sid} unfinished at {reason}; GOAWAY last id {last_id}; "
                               f"{len(open_streams)} open")
    w.close()


async def worker(a, ctx, st, deadline):
    while time.monotonic() < deadline:
        try:
            await run_conn(a, ctx, st, deadline)
        except (ConnectionError, OSError) as e:
            if len(st.examples) < 10:
                st.examples.append(f"connect: {e}")
            await asyncio.sleep(0.01)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("-c", type=int, default=8)
    ap.add_argument("-m", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--per-conn", type=int, default=0,
                    help="streams per connection, then a new one (0: until the server ends it)")
    ap.add_argument("--path", default="/1k.bin")
    ap.add_argument("--bytes", type=int, default=1024)
    a = ap.parse_args()
    ctx = None
    if a.tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
    st = Stats()
    deadline = time.monotonic() + a.seconds
    await asyncio.gather(*(worker(a, ctx, st, deadline) for _ in range(a.c)))
    print(json.dumps({"completed": st.completed, "failed": st.failed, "refused": st.refused,
                      "connections": st.connections, "closed_without_goaway": st.no_goaway_close,
                      "goaways": st.goaways[:8], "examples": st.examples}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
