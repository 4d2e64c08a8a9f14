#!/usr/bin/env python3
"""bench/overload/load.py: an open-loop HTTP/1.1 client (wrk2-style constant rate).

Usage: load.py PORT PHASES_JSON TIMEOUT_S
       load.py --closed PORT CONCURRENCY SECONDS

PHASES_JSON: [[rate_per_s, seconds], ...], run one after the other. Request i of a
phase is due at phase_start + i / rate, whatever the earlier ones are doing (a new
connection is opened when no idle keep-alive one is free), and its latency is
measured from when it was due (no coordinated omission). Paths by priority:
10% /critical, 30% /normal, 60% /low (fixed pattern). A request not answered within
TIMEOUT_S is a failure. Prints one JSON object: per request (due time offset, phase,
path kind, status or 0, latency ms).

With --closed: a closed loop instead, CONCURRENCY keep-alive connections each sending
its next request as soon as the last is answered, for SECONDS (after a 0.5 s warm-up
not counted). Prints {"rps": answered 200s per second}: with CONCURRENCY equal to
an upstream's slots, what it really serves.
"""

import asyncio
import json
import resource
import sys
import time

KINDS = ["critical"] + ["normal"] * 3 + ["low"] * 6


async def read_response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    close = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"connection" and b"close" in value.lower():
            close = True
    if length:
        await reader.readexactly(length)
    return status, close


class Pool:
    def __init__(self, port):
        self.port = port
        self.idle = []

    async def request(self, path):
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: bench\r\n\r\n")
            status, close = await read_response(reader)
        except BaseException:
            writer.close()
            raise
        if close:
            writer.close()
        else:
            self.idle.append((reader, writer))
        return status


async def one(pool, path, due, timeout, out, phase, kind, t0):
    try:
        status = await asyncio.wait_for(pool.request(path), timeout)
    except (asyncio.TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
        status = 0
    out.append((round(due - t0, 4), phase, kind, status, round((time.monotonic() - due) * 1000, 3)))


async def closed(port, concurrency, secs):
    counts = [0]
    t0 = time.monotonic()
    start, end = t0 + 0.5, t0 + 0.5 + secs

    async def loop():
        pool = Pool(port)
        while True:
            status = await pool.request(b"/normal")
            now = time.monotonic()
            if now >= end:
                return
            if status == 200 and now >= start:
                counts[0] += 1

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    json.dump({"rps": counts[0] / secs}, sys.stdout)


async def main():
    if sys.argv[1] == "--closed":
        await closed(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
        return
    port = int(sys.argv[1])
    phases = json.loads(sys.argv[2])
    timeout = float(sys.argv[3])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    pool = Pool(port)
    out, tasks = [], []
    t0 = time.monotonic()
    start = t0
    n = 0
    for p, (rate, secs) in enumerate(phases):
        count = int(rate * secs)
        for i in range(count):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            kind = KINDS[n % len(KINDS)]
            n += 1
            tasks.append(asyncio.ensure_future(
                one(pool, b"/" + kind.encode(), due, timeout, out, p, kind, t0)))
        start += secs
    await asyncio.gather(*tasks)
    json.dump({"requests": out}, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
