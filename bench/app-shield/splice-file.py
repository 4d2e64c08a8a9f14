#!/usr/bin/env python3
"""Whether splice from a socket into a file pays, against read + pwrite (issue #20:
"measure whether splice from the upstream socket into the file pays").

A sender thread writes SIZE MiB over loopback TCP as fast as the socket takes it; the
receiver moves it into an O_TMPFILE file either with recv into a 64 KiB buffer and
pwrite (what forkd's spool does), or with splice socket -> pipe -> file. The figure
is the receiver thread's CPU time per MiB (RUSAGE_THREAD), median of ROUNDS, each
mode in turn. Loopback only; every round ends by itself.

  bench/app-shield/splice-file.py [SIZE_MIB=100] [ROUNDS=7]
"""
import os, resource, socket, statistics, sys, tempfile, threading

SIZE = int(sys.argv[1]) if len(sys.argv) > 1 else 100
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 7
MIB = 1 << 20
CHUNK = 64 * 1024


def sender(port):
    s = socket.create_connection(("127.0.0.1", port))
    block = bytes(range(256)) * (CHUNK // 256)
    left = SIZE * MIB
    while left:
        left -= s.send(block[: min(left, CHUNK)])
    s.close()


def thread_cpu():
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_utime + r.ru_stime


def receive(mode):
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    t = threading.Thread(target=sender, args=(lst.getsockname()[1],))
    t.start()
    conn, _ = lst.accept()
    fd = os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR, 0o600)
    before = thread_cpu()
    got = 0
    if mode == "pwrite":
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while True:
            n = conn.recv_into(buf)
            if n == 0:
                break
            os.pwrite(fd, view[:n], got)
            got += n
    else:
        r, w = os.pipe()
        while True:
            n = os.splice(conn.fileno(), w, CHUNK)
            if n == 0:
                break
            moved = 0
            while moved < n:
                moved += os.splice(r, fd, n - moved, offset_dst=got + moved)
            got += n
        os.close(r)
        os.close(w)
    cpu = thread_cpu() - before
    t.join()
    conn.close()
    lst.close()
    assert os.fstat(fd).st_size == SIZE * MIB == got, (mode, got)
    os.close(fd)
    return cpu * 1e6 / SIZE


runs = {"pwrite": [], "splice": []}
for _ in range(ROUNDS):
    for mode in runs:
        runs[mode].append(receive(mode))
print(f"socket -> temporary file, {SIZE} MiB, median of {ROUNDS} (receiver CPU µs per MiB)")
print("| mode | µs/MiB | / pwrite |")
print("|---|---|---|")
base = statistics.median(runs["pwrite"])
for mode, v in runs.items():
    m = statistics.median(v)
    print(f"| {mode} | {m:.0f} | {m / base:.2f} |")
