#!/usr/bin/env python3
"""bench/cache/load.py: the clients of bench/cache/run (stdlib asyncio).

  load.py stampede --port P --path TARGET --n 1000 --upstream-log LOG [--timeout 10]
      Opens N connections, then writes one `GET TARGET` (Connection: close) on each in
      one loop, so the N requests reach the server within a few milliseconds, and
      reads every answer. Prints one JSON object: statuses, bodies checked against
      what the upstream sends for TARGET, X-Cache labels (nginx's and Varnish's), the
      answers' latency (p50, max), and how many requests for TARGET the upstream
      logged from the burst on. With --at-fraction F the writes start at F (0..1) of
      a wall-clock second.

  load.py steady --port P --prefix /k/ --query ttl=2 --keys 20 --rate 200 --duration 10
                 --kill-at 5 --kill-pid PID --upstream-log LOG [--snapshot-cmd CMD]
      Open loop: request i is due at i / RATE (a new connection when no keep-alive one
      is idle), for key i mod KEYS; at KILL_AT seconds it sends SIGKILL to KILL_PID
      (the upstream) and runs CMD (a shell command: the server's counters at the
      kill). An answer is ok when it is a 200 with the key's body within 2 s. Prints
      one JSON object with, before and after the kill: requests, ok, failed, X-Cache
      labels, p50/p99 of the ok answers (from when each was due), and the upstream's
      requests (from LOG), so the hit ratio before the kill
      is 1 - upstream / requests whatever the server says of itself.
"""

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from upstream import body_of  # noqa: E402


def expected_body(target):
    path, _, query = target.partition("?")
    size = 1024
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name == "size":
            size = int(value)
    return body_of(path, size)


def parse_head(head):
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name:
            fields[name.strip().lower().decode()] = value.strip().decode("latin-1")
    return status, fields


async def read_response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status, fields = parse_head(head[:-4])
    if "content-length" in fields:
        body = await reader.readexactly(int(fields["content-length"]))
    elif status in (204, 304):
        body = b""
    else:
        body = await reader.read()
    return status, fields, body


def upstream_lines(log, target=None):
    """(time, status, target) of each request the upstream logged."""
    out = []
    try:
        with open(log) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and (target is None or parts[2] == target):
                    out.append((float(parts[0]), int(parts[1]), parts[2]))
    except FileNotFoundError:
        pass
    return out


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def count(labels):
    out = {}
    for label in labels:
        out[label] = out.get(label, 0) + 1
    return out


# ---- stampede ---------------------------------------------------------------------


async def stampede(args):
    want = expected_body(args.path)
    request = f"GET {args.path} HTTP/1.1\r\nHost: 127.0.0.1:{args.port}\r\nConnection: close\r\n\r\n".encode()
    results = await asyncio.gather(
        *[asyncio.open_connection("127.0.0.1", args.port) for _ in range(args.n)],
        return_exceptions=True,
    )
    conns = [r for r in results if not isinstance(r, BaseException)]
    connect_failed = len(results) - len(conns)
    if args.at_fraction is not None:
        # Wait for that point of a wall-clock second (Date and the caches' clocks
        # have whole seconds): to put the fetch's answer where a boundary falls.
        await asyncio.sleep((args.at_fraction - time.time()) % 1)
    wall0 = time.time()
    t0 = time.monotonic()
    for _, writer in conns:
        writer.write(request)
    sent_ms = (time.monotonic() - t0) * 1000

    async def one(reader, writer):
        try:
            status, fields, body = await read_response(reader)
            return status, fields.get("x-cache", "-"), body == want, (time.monotonic() - t0) * 1000
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError):
            return 0, "-", False, None
        finally:
            writer.close()

    async def bounded():
        return await asyncio.gather(*[one(r, w) for r, w in conns])

    try:
        answers = await asyncio.wait_for(bounded(), args.timeout)
    except asyncio.TimeoutError:
        answers = []
    await asyncio.sleep(0.3)  # the upstream's log lines of a last refresh
    ups = [t for t, _, _ in upstream_lines(args.upstream_log, args.path) if t >= wall0 - 0.001]
    latencies = [a[3] for a in answers if a[3] is not None]
    ok = sum(1 for a in answers if a[0] == 200 and a[2])
    return {
        "requests": args.n,
        "connect_failed": connect_failed,
        "sent_within_ms": round(sent_ms, 2),
        "ok": ok,
        "failed": args.n - ok,
        "statuses": count(str(a[0]) for a in answers),
        "bad_bodies": sum(1 for a in answers if a[0] == 200 and not a[2]),
        "labels": count(a[1] for a in answers),
        "p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
        "max_ms": round(max(latencies), 1) if latencies else None,
        "upstream_requests": len(ups),
    }


# ---- steady load through a kill ------------------------------------------------------


class Pool:
    def __init__(self, port):
        self.port = port
        self.idle = []

    async def get(self, target):
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode())
            status, fields, body = await read_response(reader)
        except BaseException:
            writer.close()
            raise
        if fields.get("connection", "").lower() == "close":
            writer.close()
        else:
            self.idle.append((reader, writer))
        return status, fields, body


async def steady(args):
    pool = Pool(args.port)
    targets = [f"{args.prefix}{k}?{args.query}" for k in range(args.keys)]
    bodies = [expected_body(t) for t in targets]
    records = []
    snapshot = {}
    wall0 = time.time()
    t0 = time.monotonic()

    async def one(i, due):
        k = i % args.keys
        try:
            status, fields, body = await asyncio.wait_for(pool.get(targets[k]), args.timeout)
            good = status == 200 and body == bodies[k]
            label = fields.get("x-cache", "-")
        except (asyncio.TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            status, good, label = 0, False, "-"
        records.append((due - t0, status, good, label, (time.monotonic() - due) * 1000))

    def kill():
        snapshot["kill_wall"] = time.time()
        try:
            os.kill(args.kill_pid, signal.SIGKILL)
        except ProcessLookupError:
            snapshot["kill_error"] = "no such process"
        if args.snapshot_cmd:
            p = subprocess.run(args.snapshot_cmd, shell=True, capture_output=True, text=True)
            snapshot["at_kill"] = p.stdout.strip()

    tasks = []
    killed = None
    n = int(args.rate * args.duration)
    for i in range(n):
        due = t0 + i / args.rate
        if killed is None and due - t0 >= args.kill_at:
            killed = asyncio.get_running_loop().run_in_executor(None, kill)
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i, due)))
    await asyncio.gather(*tasks)
    if killed is not None:
        await killed
    kill_wall = snapshot.get("kill_wall", wall0 + args.kill_at)
    ups = [t for t, _, tgt in upstream_lines(args.upstream_log) if tgt.startswith(args.prefix)]

    def phase(before):
        rs = [r for r in records if (r[0] < args.kill_at) == before]
        return {
            "requests": len(rs),
            "ok": sum(1 for r in rs if r[2]),
            "failed": sum(1 for r in rs if not r[2]),
            "statuses": count(str(r[1]) for r in rs),
            "labels": count(r[3] for r in rs),
            "p50_ms": round(percentile([r[4] for r in rs if r[2]], 50) or 0, 1),
            "p99_ms": round(percentile([r[4] for r in rs if r[2]], 99) or 0, 1),
            "upstream_requests": sum(1 for t in ups if (t < kill_wall) == before),
        }

    return {
        "rate": args.rate,
        "keys": args.keys,
        "duration": args.duration,
        "kill_at": args.kill_at,
        "before": phase(True),
        "after": phase(False),
        "snapshot_at_kill": snapshot.get("at_kill"),
        "kill_error": snapshot.get("kill_error"),
    }


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stampede")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--path", required=True)
    s.add_argument("--n", type=int, default=1000)
    s.add_argument("--timeout", type=float, default=10)
    s.add_argument("--upstream-log", required=True)
    s.add_argument("--at-fraction", type=float, default=None)
    t = sub.add_parser("steady")
    t.add_argument("--port", type=int, required=True)
    t.add_argument("--prefix", required=True)
    t.add_argument("--query", default="ttl=2")
    t.add_argument("--keys", type=int, default=20)
    t.add_argument("--rate", type=float, default=200)
    t.add_argument("--duration", type=float, default=10)
    t.add_argument("--kill-at", type=float, default=5)
    t.add_argument("--kill-pid", type=int, required=True)
    t.add_argument("--timeout", type=float, default=2)
    t.add_argument("--upstream-log", required=True)
    t.add_argument("--snapshot-cmd", default="")
    args = p.parse_args()
    out = asyncio.run(stampede(args) if args.cmd == "stampede" else steady(args))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
