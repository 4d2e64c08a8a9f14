#!/usr/bin/env python3
"""bench/app-shield/load.py: the clients of bench/app-shield/run (stdlib only).

  load.py scenario --server NAME --port P --case alone|readers|uploaders [--rss-pid PID]
      One normal client GETs /tiny through the proxy, one request after another
      (paced at --rate per second; 0: back to back) for --duration seconds, each
      request given --timeout seconds from its first byte sent to its last byte read.
      Beside it, for `readers`: --clients connections GET /big?mb=--big-mb and read
      it at --pace bytes/s (small recv()s with sleeps, a small SO_RCVBUF); for
      `uploaders`: --clients connections POST --upload-bytes to /upload at --pace
      bytes/s. The normal client starts once every slow client has sent its request
      head, plus --ramp seconds. With --rss-pid, that process's VmRSS is sampled every
      200 ms from before the slow clients start until they stop.
      Prints one JSON object (a line) with the counts and percentiles.
  load.py cpu --server NAME --port P --pid WORKER [--mb 100] [--rounds 3]
      A fast client (pinned to CPU 1) GETs /big?mb=N through the proxy and reads it
      whole; the proxy worker's time on the CPU (/proc/PID/schedstat, in ns; the
      utime+stime of /proc/PID/stat beside it as a check) before and after, per MiB.
      Prints one JSON object. With --spooled (case `cpu-spooled`): the client sends
      the request and reads nothing until the worker has read the response into its
      temporary file (its open temporary files and its CPU time stopped growing for
      0.5 s; at most 120 s), then reads it whole at full speed; the CPU time is from
      before the request to the last byte. Per round it records the bytes in the
      worker's open temporary files when the read began and, with --forkd BIN
      --forkd-config FILE, how much forkd's `temp_file_bytes` total grew.
  load.py settle --port P
      Waits (at most 60 s) until the application answers /tiny 5 times in a row
      within 0.5 s each: no worker is still held by the previous scenario.
  load.py report FILE
      The markdown tables from the JSON lines in FILE.

127.0.0.1 only; every loop is bounded by --duration or a deadline.
"""

import argparse
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections import Counter

HOST = "127.0.0.1"
TINY = b"tiny\n"
TICK = os.sysconf("SC_CLK_TCK")


class Timeout(Exception):
    pass


class Protocol(Exception):
    pass


def read_response(sock, deadline):
    """One response (Content-Length, chunked or until close); (status, body, closes)."""
    buf = b""

    def more():
        nonlocal buf
        left = deadline - time.monotonic()
        if left <= 0:
            raise Timeout()
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except socket.timeout:
            raise Timeout() from None
        if not data:
            return False
        buf += data
        return True

    while b"\r\n\r\n" not in buf:
        if not more():
            raise Protocol("closed before a response head" if not buf else "closed in the head")
    head, _, buf = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise Protocol(f"bad status line {lines[0]!r}") from None
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    closes = "close" in fields.get("connection", "").lower()
    if "content-length" in fields:
        n = int(fields["content-length"])
        while len(buf) < n:
            if not more():
                raise Protocol("closed in the body")
        return status, buf[:n], closes
    if "chunked" in fields.get("transfer-encoding", "").lower():
        body = b""
        while True:
            while b"\r\n" not in buf:
                if not more():
                    raise Protocol("closed in a chunk size")
            size_line, _, buf = buf.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(buf) < size + 2:
                if not more():
                    raise Protocol("closed in a chunk")
            body += buf[:size]
            buf = buf[size + 2 :]
            if size == 0:
                return status, body, closes
    while more():
        pass
    return status, buf, True


def percentile(sorted_values, q):
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))
    return sorted_values[i]


def normal_client(port, duration, rate, timeout):
    """GET /tiny in a loop; counts and latencies (ms) of the 200s with the right body."""
    request = b"GET /tiny HTTP/1.1\r\nHost: app.test\r\n\r\n"
    lat, reasons = [], Counter()
    ok = failed = timed_out = 0
    conn = None
    start = time.monotonic()
    end = start + duration
    due = start
    while True:
        now = time.monotonic()
        if rate:
            if due > now:
                time.sleep(due - now)
            due = max(due + 1 / rate, time.monotonic())
        t0 = time.monotonic()
        if t0 >= end:
            break
        deadline = t0 + timeout
        try:
            if conn is None:
                conn = socket.create_connection((HOST, port), timeout=timeout)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            conn.sendall(request)
            status, body, closes = read_response(conn, deadline)
            if status == 200 and body == TINY:
                ok += 1
                lat.append((time.monotonic() - t0) * 1000)
            else:
                failed += 1
                reasons[f"status {status}" if status != 200 else "wrong body"] += 1
            if closes:
                conn.close()
                conn = None
        except (Timeout, socket.timeout):
            timed_out += 1
            conn = close(conn)
        except (OSError, Protocol, ValueError) as e:
            failed += 1
            reasons[type(e).__name__ + (f": {e}" if isinstance(e, Protocol) else "")] += 1
            conn = close(conn)
    close(conn)
    lat.sort()
    return {
        "ok": ok,
        "failed": failed,
        "timed_out": timed_out,
        "p50_ms": percentile(lat, 0.50),
        "p99_ms": percentile(lat, 0.99),
        "max_ms": lat[-1] if lat else None,
        "reasons": dict(reasons),
    }


def close(conn):
    if conn is not None:
        try:
            conn.close()
        except OSError:
            pass
    return None


class Slow:
    """What one slow client did."""

    def __init__(self):
        self.sent_head = threading.Event()
        self.bytes = 0
        self.requests = 0
        self.completed = 0
        self.errors = Counter()


def slow_reader(port, path, pace, stop, me):
    piece = 1000
    while not stop.is_set():
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(1)
            s.connect((HOST, port))
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: app.test\r\n\r\n".encode())
            me.requests += 1
            me.sent_head.set()
            while not stop.is_set():
                try:
                    data = s.recv(piece)
                except socket.timeout:
                    continue
                if not data:
                    me.errors["closed by the proxy"] += 1
                    break
                me.bytes += len(data)
                stop.wait(len(data) / pace)
        except OSError as e:
            me.errors[type(e).__name__] += 1
            stop.wait(0.1)
        finally:
            s.close()


def slow_uploader(port, total, pace, stop, me):
    piece = b"u" * 1000
    while not stop.is_set():
        s = socket.socket()
        try:
            s.settimeout(1)
            s.connect((HOST, port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(
                f"POST /upload HTTP/1.1\r\nHost: app.test\r\nContent-Length: {total}\r\n"
                "Content-Type: application/octet-stream\r\n\r\n".encode()
            )
            me.requests += 1
            me.sent_head.set()
            sent = 0
            while sent < total and not stop.is_set():
                try:
                    n = s.send(piece[: min(len(piece), total - sent)])
                except socket.timeout:
                    continue
                sent += n
                me.bytes += n
                stop.wait(n / pace)
            if sent == total:
                status, body, _ = read_response(s, time.monotonic() + 30)
                if status == 200 and body.startswith(f"{total} ".encode()):
                    me.completed += 1
                else:
                    me.errors[f"upload answered {status}"] += 1
        except (OSError, Protocol, Timeout) as e:
            me.errors[type(e).__name__] += 1
            stop.wait(0.1)
        finally:
            s.close()


def vm_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_sampler(pid, stop, samples):
    while not stop.is_set():
        v = vm_rss_kib(pid)
        if v is not None:
            samples.append(v)
        stop.wait(0.2)


def scenario(a):
    stop, rss_stop = threading.Event(), threading.Event()
    rss = []
    sampler = None
    if a.rss_pid:
        sampler = threading.Thread(target=rss_sampler, args=(a.rss_pid, rss_stop, rss))
        sampler.start()
    slow, threads = [], []
    for _ in range(a.clients if a.case != "alone" else 0):
        me = Slow()
        if a.case == "readers":
            args = (a.port, f"/big?mb={a.big_mb}", a.pace, stop, me)
            target = slow_reader
        else:
            args = (a.port, a.upload_bytes, a.pace, stop, me)
            target = slow_uploader
        t = threading.Thread(target=target, args=args, daemon=True)
        slow.append(me)
        threads.append(t)
        t.start()
    deadline = time.monotonic() + 10
    for me in slow:
        me.sent_head.wait(max(0, deadline - time.monotonic()))
    heads_sent = sum(me.sent_head.is_set() for me in slow)
    if slow:
        time.sleep(a.ramp)
    result = normal_client(a.port, a.duration, a.rate, a.timeout)
    stop.set()
    for t in threads:
        t.join(timeout=35)
    rss_stop.set()
    if sampler:
        sampler.join()
    errors = Counter()
    for me in slow:
        errors.update(me.errors)
    result.update(
        {
            "server": a.server,
            "case": a.case,
            "duration_s": a.duration,
            "rate": a.rate,
            "timeout_s": a.timeout,
            "slow_clients": len(slow),
            "slow_heads_sent": heads_sent,
            "slow_requests": sum(me.requests for me in slow),
            "slow_bytes": sum(me.bytes for me in slow),
            "slow_completed": sum(me.completed for me in slow),
            "slow_errors": dict(errors),
            "rss_kib_first": rss[0] if rss else None,
            "rss_kib_max": max(rss) if rss else None,
        }
    )
    print(json.dumps(result))


def proc_ticks(pid):
    """utime + stime, in clock ticks (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def proc_cpu_ns(pid):
    """Time on the CPU in ns (/proc/PID/schedstat): the same time as utime + stime, but
    not in 10 ms ticks, which a 100 MiB transfer costing tens of ms cannot afford."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def read_big(s, buf, want, server):
    """Reads the response to GET /big on s whole (head, then `want` body bytes) at full
    speed; exits if it is not a 200 of exactly `want` bytes."""
    got, head = 0, b""
    view = memoryview(buf)
    while True:
        n = s.recv_into(view)
        if not n:
            break
        if head is not None:
            head += bytes(view[:n])
            if b"\r\n\r\n" not in head:
                continue
            h, _, rest = head.partition(b"\r\n\r\n")
            if not h.startswith(b"HTTP/1.1 200"):
                sys.exit(f"cpu: {server} answered {h[:40]!r}")
            got, head = len(rest), None
        else:
            got += n
        if got >= want:
            break
    if got != want:
        sys.exit(f"cpu: {server} sent {got} body bytes, not {want}")


def temp_file_bytes_open(pid):
    """The size of the regular files without a name PID holds open (its temporary
    files: forkd's O_TMPFILE ones, nginx's proxy_temp files it unlinks once made), as
    /proc/PID/fd shows them ("... (deleted)")."""
    total = 0
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
            if not target.endswith(" (deleted)"):
                continue
            st = os.stat(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


def forkd_temp_file_bytes(forkd, config):
    """forkd's `temp_file_bytes` total (`forkd stats -c CONFIG --json`)."""
    out = subprocess.run(
        [forkd, "stats", "-c", config, "--json"], capture_output=True, check=True, timeout=30
    )
    return json.loads(out.stdout)["totals"]["temp_file_bytes"]


def wait_spooled(a, want, deadline_s=120, quiet_s=0.5):
    """Until the proxy has read the whole response into its temporary file while the
    client reads nothing: its open temporary files have stopped growing and its
    worker's CPU time too (less than 1 ms in quiet_s), both for quiet_s, with at least
    half the body in the files (what the sockets hold, a few MiB, is the rest).
    Bounded: exits after deadline_s. Returns (seconds waited, temp file bytes)."""
    t0 = time.monotonic()
    last_change = t0
    cpu, size = proc_cpu_ns(a.pid), temp_file_bytes_open(a.pid)
    while True:
        time.sleep(0.05)
        now = time.monotonic()
        c, z = proc_cpu_ns(a.pid), temp_file_bytes_open(a.pid)
        if z != size or c - cpu > 1_000_000:
            cpu, size, last_change = c, z, now
        elif now - last_change >= quiet_s and size >= want // 2:
            return now - t0, size
        if now - t0 > deadline_s:
            sys.exit(
                f"cpu-spooled: {a.server} had {size} bytes in temporary files after "
                f"{deadline_s} s (want most of {want}): it did not spool the response"
            )


def cpu(a):
    """The `cpu` and `cpu-spooled` cases (a.spooled)."""
    try:
        os.sched_setaffinity(0, {1})
    except OSError:
        pass
    request = f"GET /big?mb={a.mb} HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n"
    want = a.mb << 20
    buf = bytearray(1 << 20)
    per_mib, ticks_per_mib, spool = [], [], []
    for _ in range(a.rounds):
        stats_before = forkd_temp_file_bytes(a.forkd, a.forkd_config) if a.forkd else None
        before, ticks_before = proc_cpu_ns(a.pid), proc_ticks(a.pid)
        s = socket.create_connection((HOST, a.port), timeout=30)
        s.sendall(request.encode())
        if a.spooled:
            # Reading nothing: the receive buffer stays at its initial size (no
            # SO_RCVBUF, so autotuning is left to the read below, as in `cpu`), the
            # proxy's send buffer fills, and the rest must go to its temporary file.
            waited, in_files = wait_spooled(a, want)
            spooling_ns = proc_cpu_ns(a.pid) - before
        read_big(s, buf, want, a.server)
        s.close()
        per_mib.append((proc_cpu_ns(a.pid) - before) / 1e3 / a.mb)
        ticks_per_mib.append((proc_ticks(a.pid) - ticks_before) / TICK * 1e6 / a.mb)
        if a.spooled:
            round_ = {
                "waited_s": round(waited, 2),
                "temp_file_bytes_open": in_files,
                # The worker's CPU until the client began to read (upstream → file),
                # per MiB of the response; the rest of us_per_mib is file → client.
                "spooling_us_per_mib": round(spooling_ns / 1e3 / a.mb, 1),
            }
            if a.forkd:
                # The worker adds its temporary files' counts to the stats region when
                # an exchange is accounted and once per clock tick, so the total lags:
                # give it 5 s to show at least what the files held.
                deadline = time.monotonic() + 5
                while True:
                    grown = forkd_temp_file_bytes(a.forkd, a.forkd_config) - stats_before
                    if grown >= in_files or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
                round_["forkd_temp_file_bytes"] = grown
            spool.append(round_)
            print(f"{a.server}: {round_}", file=sys.stderr)
    per_mib.sort()
    record = {
        "server": a.server,
        "case": "cpu-spooled" if a.spooled else "cpu",
        "mb": a.mb,
        "us_per_mib": per_mib,
        "stat_ticks_us_per_mib_mean": sum(ticks_per_mib) / len(ticks_per_mib),
        "median_us_per_mib": per_mib[len(per_mib) // 2],
    }
    if a.spooled:
        record["spool"] = spool
    print(json.dumps(record))


def settle(a):
    deadline = time.monotonic() + 60
    in_a_row = 0
    while time.monotonic() < deadline and in_a_row < 5:
        t0 = time.monotonic()
        try:
            with socket.create_connection((HOST, a.port), timeout=0.5) as s:
                s.sendall(b"GET /tiny HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
                status, body, _ = read_response(s, t0 + 0.5)
            in_a_row = in_a_row + 1 if status == 200 and body == TINY else 0
        except (OSError, Protocol, Timeout):
            in_a_row = 0
            time.sleep(0.1)
    if in_a_row < 5:
        sys.exit(f"settle: the application on port {a.port} did not recover within 60 s")


def fmt(v, unit=""):
    if v is None:
        return "-"
    return f"{v:.2f}{unit}" if isinstance(v, float) else f"{v}{unit}"


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def client_tables(runs, servers, cases, a):
    """The normal client's table per server, and the targets of the cases."""
    names = {
        "alone": "alone",
        "readers": "beside {n} slow readers of /big?mb={mb}",
        "uploaders": "beside {n} slow uploaders of {kb} KB",
    }
    first = next(r for r in runs.values() if r["case"] in names)
    out = []
    out.append(
        f"Normal client: GET /tiny one after another, {first.get('rate', 0) or 'back to back'}"
        f"{'/s' if first.get('rate') else ''}, {fmt(first.get('duration_s'))} s per case, "
        f"{fmt(first.get('timeout_s'))} s timeout per request.\n"
    )
    out.append(
        "| server | case | ok | failed | timed out | p50 ms | p99 ms | max ms | p99 / alone | "
        "slow clients' bytes moved | worker RSS KiB (first → max) |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for s in servers:
        alone = runs.get((s, "alone"), {}).get("p99_ms")
        for c in cases:
            r = runs.get((s, c))
            if not r:
                continue
            name = names[c].format(n=r["slow_clients"], mb=a.big_mb, kb=a.upload_kb)
            moved = "-" if c == "alone" else f"{r['slow_bytes']:,}"
            out.append(
                f"| {s} | {name} | {r['ok']} | {r['failed']} | {r['timed_out']} | "
                f"{fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | {fmt(r['max_ms'])} | "
                f"{fmt(ratio(r['p99_ms'], alone)) if c != 'alone' else '1'} | {moved} | "
                f"{fmt(r['rss_kib_first'])} → {fmt(r['rss_kib_max'])} |"
            )
    out.append("")
    if "forkd" in servers:
        out.append(
            "Targets (issue #20): forkd 0 failed (or timed out) requests and p99 within 2× "
            "of its unloaded p99 in every case; nginx beside.\n"
        )
        out.append(
            "| case | forkd failed + timed out | forkd p99 / alone | met | "
            "nginx failed + timed out | nginx p99 / alone | forkd p99 / nginx p99 |"
        )
        out.append("|---|---|---|---|---|---|---|")
        for c in cases:
            f, n = runs.get(("forkd", c)), runs.get(("nginx", c))
            fa = runs.get(("forkd", "alone"), {}).get("p99_ms")
            na = runs.get(("nginx", "alone"), {}).get("p99_ms")
            fr = ratio(f["p99_ms"], fa) if f else None
            bad = f["failed"] + f["timed_out"] if f else None
            met = "-" if f is None else (
                "yes" if bad == 0 and f["ok"] > 0 and fr is not None and fr <= 2 else "NO"
            )
            out.append(
                f"| {c} | {fmt(bad)} | {fmt(fr)} | {met} | "
                f"{fmt(n['failed'] + n['timed_out']) if n else '-'} | "
                f"{fmt(ratio(n['p99_ms'], na)) if n else '-'} | "
                f"{fmt(ratio(f['p99_ms'], n['p99_ms'])) if f and n else '-'} |"
            )
        out.append("")
    return out


def merge_cpu(records):
    """The cpu records by server; a case listed more than once (CASES="cpu cpu cpu",
    so the servers take turns) is one record of all its rounds."""
    out = {}
    for r in records:
        m = out.setdefault(r["server"], dict(r, us_per_mib=[], ticks=[]))
        m["us_per_mib"] = sorted(m["us_per_mib"] + r["us_per_mib"])
        m["ticks"].append(r["stat_ticks_us_per_mib_mean"])
    for m in out.values():
        m["median_us_per_mib"] = m["us_per_mib"][len(m["us_per_mib"]) // 2]
        m["stat_ticks_us_per_mib_mean"] = sum(m["ticks"]) / len(m["ticks"])
    return out


def cpu_tables(rows, case):
    """The CPU-per-MiB tables of case `cpu` or `cpu-spooled`."""
    out = []
    cpu_rows = merge_cpu([r for r in rows if r["case"] == case])
    if not cpu_rows:
        return out
    f, n = cpu_rows.get("forkd"), cpu_rows.get("nginx")
    mb = next(iter(cpu_rows.values()))["mb"]
    r = ratio(f and f["median_us_per_mib"], n and n["median_us_per_mib"])
    what = (
        "fast client"
        if case == "cpu"
        else "the client reads nothing until the proxy has the response in its temporary "
        "file, then everything at full speed; from before the request to the last byte"
    )
    out.append(
        f"Proxy worker CPU per MiB of a {mb} MiB response, case `{case}` ({what}; median of "
        f"{len(next(iter(cpu_rows.values()))['us_per_mib'])}, time on the CPU from "
        f"/proc/PID/schedstat; target forkd / nginx ≤ 0.7):\n"
    )
    out.append("| forkd µs/MiB | nginx µs/MiB | forkd / nginx | met | utime+stime mean: forkd, nginx |")
    out.append("|---|---|---|---|---|")
    out.append(
        f"| {fmt(f and f['median_us_per_mib'])} | {fmt(n and n['median_us_per_mib'])} | "
        f"{fmt(r)} | {'-' if r is None else ('yes' if r <= 0.7 else 'NO')} | "
        f"{fmt(f and f['stat_ticks_us_per_mib_mean'])}, "
        f"{fmt(n and n['stat_ticks_us_per_mib_mean'])} |"
    )
    out.append("")
    others = [x for x in ("forkd-b", "relay-copy", "relay-splice") if x in cpu_rows]
    if others or case == "cpu-spooled":
        out.append(
            "Each server's rounds (forkd-b: FORKD_B_BIN; relay-copy / relay-splice: "
            "bench/app-shield/relay.py moving the bytes with recv/send or splice):\n"
        )
        out.append("| server | µs/MiB, each round (sorted) | median | / nginx | / forkd |")
        out.append("|---|---|---|---|---|")
        for name in ("forkd", "forkd-b", "nginx", "relay-copy", "relay-splice"):
            row = cpu_rows.get(name)
            if not row:
                continue
            m = row["median_us_per_mib"]
            out.append(
                f"| {name} | {', '.join(f'{v:.0f}' for v in row['us_per_mib'])} | "
                f"{fmt(m)} | {fmt(ratio(m, n and n['median_us_per_mib']))} | "
                f"{fmt(ratio(m, f and f['median_us_per_mib']))} |"
            )
        out.append("")
    if case == "cpu-spooled":
        out.append(
            "Did it spool? Per round: the bytes in the worker's open temporary files (files "
            "without a name in /proc/PID/fd) when the client started reading, and forkd's "
            "`temp_file_bytes` total (`forkd stats --json`) grown over the round:\n"
        )
        out.append(
            "| server | temporary files when the read began, MiB | forkd temp_file_bytes "
            "grown, MiB | waited s | CPU until the read began, µs/MiB |"
        )
        out.append("|---|---|---|---|---|")
        mib = 1 << 20
        for r in rows:
            if r["case"] != case:
                continue
            for sp in r.get("spool", []):
                grown = sp.get("forkd_temp_file_bytes")
                out.append(
                    f"| {r['server']} | {sp['temp_file_bytes_open'] / mib:.1f} | "
                    f"{'-' if grown is None else f'{grown / mib:.1f}'} | {sp['waited_s']} | "
                    f"{sp.get('spooling_us_per_mib', '-')} |"
                )
        out.append("")
    return out


def report(a):
    rows = [json.loads(line) for line in open(a.file) if line.strip()]
    runs = {(r["server"], r["case"]): r for r in rows}
    servers = [s for s in ("forkd", "forkd-b", "nginx") if any(k[0] == s for k in runs)]
    cases = [c for c in ("alone", "readers", "uploaders") if any(k[1] == c for k in runs)]
    out = []
    if cases:
        out.extend(client_tables(runs, servers, cases, a))
    for case in ("cpu", "cpu-spooled"):
        out.extend(cpu_tables(rows, case))
    readers = [runs.get((s, "readers")) for s in servers]
    if any(readers):
        out.append(
            f"Proxy worker RSS while the slow readers run (sampled every 200 ms; "
            f"'flat': it grows by at most {a.flat_kib} KiB):\n"
        )
        out.append("| server | first KiB | max KiB | growth KiB | flat |")
        out.append("|---|---|---|---|---|")
        for s, r in zip(servers, readers):
            if not r or r["rss_kib_first"] is None:
                continue
            growth = r["rss_kib_max"] - r["rss_kib_first"]
            out.append(
                f"| {s} | {r['rss_kib_first']} | {r['rss_kib_max']} | {growth} | "
                f"{'yes' if growth <= a.flat_kib else 'NO'} |"
            )
        out.append("")
    notes = []
    for (s, c), r in sorted(runs.items()):
        if c.startswith("cpu"):
            continue
        if r.get("reasons"):
            notes.append(f"- {s} {c}: normal client failures: {r['reasons']}")
        if r.get("slow_errors"):
            notes.append(
                f"- {s} {c}: slow clients: {r['slow_requests']} requests, "
                f"{r['slow_completed']} completed, errors {r['slow_errors']}"
            )
    if notes:
        out.append("Failures seen:\n")
        out.extend(notes)
        out.append("")
    print("\n".join(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sc = sub.add_parser("scenario")
    sc.add_argument("--server", required=True)
    sc.add_argument("--port", type=int, required=True)
    sc.add_argument("--case", choices=("alone", "readers", "uploaders"), required=True)
    sc.add_argument("--duration", type=float, default=10)
    sc.add_argument("--rate", type=float, default=50)
    sc.add_argument("--timeout", type=float, default=2)
    sc.add_argument("--clients", type=int, default=32)
    sc.add_argument("--pace", type=float, default=10_000)
    sc.add_argument("--big-mb", type=int, default=20)
    sc.add_argument("--upload-bytes", type=int, default=500_000)
    sc.add_argument("--ramp", type=float, default=1)
    sc.add_argument("--rss-pid", type=int)
    cp = sub.add_parser("cpu")
    cp.add_argument("--server", required=True)
    cp.add_argument("--port", type=int, required=True)
    cp.add_argument("--pid", type=int, required=True)
    cp.add_argument("--mb", type=int, default=100)
    cp.add_argument("--rounds", type=int, default=5)
    cp.add_argument("--spooled", action="store_true")
    cp.add_argument("--forkd", help="forkd binary: count temp_file_bytes per round (spooled)")
    cp.add_argument("--forkd-config")
    st = sub.add_parser("settle")
    st.add_argument("--port", type=int, required=True)
    rp = sub.add_parser("report")
    rp.add_argument("file")
    rp.add_argument("--big-mb", type=int, default=20)
    rp.add_argument("--upload-kb", type=int, default=500)
    rp.add_argument("--flat-kib", type=int, default=8192)
    a = p.parse_args()
    {"scenario": scenario, "cpu": cpu, "settle": settle, "report": report}[a.cmd](a)


if __name__ == "__main__":
    main()
