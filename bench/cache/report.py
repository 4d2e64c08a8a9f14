#!/usr/bin/env python3
"""bench/cache/report.py RECORDS.jsonl: the markdown tables of bench/cache/run.

Reads the JSON lines the run wrote (one per measured round, stampede or kill run) and
prints: CPU per cached hit per server and body size (median of the rounds) with the
ratios forkd/nginx and forkd/varnish; upstream requests per stampede; failed
requests, hit ratio and stale answers through the application kill.
"""

import json
import statistics
import sys

SERVERS = ["forkd", "nginx", "varnish"]


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "-"


def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def size_name(n):
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} B"


def user_us(rounds):
    """The median over the rounds of user-space CPU µs per response."""
    if not all("kernel_ticks" in r for r in rounds):
        return None
    return statistics.median((r["ticks"] - r["kernel_ticks"]) / r["hz"] * 1e6 / r["requests"] for r in rounds)


def cpu(records):
    rs = [r for r in records if r["case"] == "cpu"]
    if not rs:
        return
    sizes = sorted({r["size"] for r in rs})
    rounds = max(r["round"] for r in rs)
    print("## CPU µs per cached hit")
    print()
    print(f"Keep-alive, `wrk -t1 -c{rs[0].get('connections', 64)}` on CPU 1, the whole server on CPU 0,")
    print("one worker (Varnish: one process, one thread pool); utime+stime of all the server's")
    print(f"processes per response; median of {rounds} rounds. Target: forkd ≤ 0.70 × nginx.")
    print()
    print("| body | forkd µs/hit | nginx µs/hit | Varnish µs/hit | forkd / nginx | forkd / Varnish | target met |")
    print("|---|---|---|---|---|---|---|")
    for size in sizes:
        med = {}
        for s in SERVERS:
            v = [r["us_per_req"] for r in rs if r["server"] == s and r["size"] == size]
            med[s] = statistics.median(v) if v else None
        fn = ratio(med["forkd"], med["nginx"])
        met = "-" if fn == "-" else ("yes" if float(fn) <= 0.70 else "NO")
        print(f"| {size_name(size)} | {fmt(med['forkd'])} | {fmt(med['nginx'])} | {fmt(med['varnish'])} "
              f"| {fn} | {ratio(med['forkd'], med['varnish'])} | {met} |")
    print()
    print("Per round (µs/hit; requests; the kernel's share of the server's CPU, stime / (utime + stime)):")
    print()
    print("| body | server | µs/hit of each round | requests of each round | kernel share | user µs/hit (median) | errors | upstream requests during the runs |")
    print("|---|---|---|---|---|---|---|---|")
    for size in sizes:
        for s in SERVERS:
            v = [r for r in rs if r["server"] == s and r["size"] == size]
            if not v:
                continue
            ticks = sum(r["ticks"] for r in v)
            known = ticks and all("kernel_ticks" in r for r in v)
            share = sum(r["kernel_ticks"] for r in v) / ticks if known else None
            print(f"| {size_name(size)} | {s} | {' '.join(fmt(r['us_per_req']) for r in v)} "
                  f"| {' '.join(str(r['requests']) for r in v)} | {fmt(share)} | {fmt(user_us(v))} "
                  f"| {sum(r['non2xx'] + r['socket_errors'] for r in v)} "
                  f"| {sum(r['upstream_requests'] for r in v)} |")
    print()


def labels(d):
    return " ".join(f"{k} {v}" for k, v in sorted(d.items()) if k != "-") or "-"


def counters(d, keep):
    return " ".join(f"{k} {d[k]}" for k in keep if d.get(k)) or "-"


FORKD_KEYS = ["hits", "misses", "stale", "revalidated", "lock_waits", "stores", "bypass"]
VARNISH_KEYS = ["cache_hit", "cache_hit_grace", "cache_miss", "busy_sleep", "backend_req",
                "backend_fail", "fetch_failed", "bgfetch", "sess_dropped"]


def server_counters(r, d):
    if r["server"] == "forkd":
        return counters(d, FORKD_KEYS)
    if r["server"] == "varnish":
        return counters(d, VARNISH_KEYS)
    return "-"


def stampede(records):
    rs = [r for r in records if r["case"] == "stampede"]
    if not rs:
        return
    n = rs[0]["requests"]
    print("## Stampede: upstream requests for one key")
    print()
    print(f"{n} concurrent requests (all connections open first, then one write each) for a key the")
    print("application answers in 200 ms; forkd and nginx with 2 workers, Varnish one process.")
    print("`new`: never fetched; `expired`: stored with max-age=1 and expired, on the route without")
    print("stale-while-revalidate; `expired-swr`: the same on the issue's route (forkd")
    print("`stale_while_revalidate: \"30s\"`, nginx `updating` + `proxy_cache_background_update on`,")
    print("Varnish grace). Target: 1 upstream request for forkd.")
    print()
    print("| key | server | upstream requests | ok | failed | answers (X-Cache) | p50 ms | max ms | the server's counters |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v in ["new", "expired", "expired-swr"]:
        for s in SERVERS:
            for r in [r for r in rs if r["variant"] == v and r["server"] == s]:
                print(f"| {v} | {s} | **{r['upstream_requests']}** | {r['ok']} | {r['failed']} "
                      f"| {labels(r['labels'])} | {fmt(r['p50_ms'], 1)} | {fmt(r['max_ms'], 1)} "
                      f"| {server_counters(r, r['counters'])} |")
    print()


def kill(records):
    rs = [r for r in records if r["case"] == "kill"]
    if not rs:
        return
    r0 = rs[0]
    print("## The application killed under load")
    print()
    print(f"{r0['rate']:g} req/s (open loop) over {r0['keys']} keys with max-age=2 for {r0['duration']:g} s,")
    print(f"the application SIGKILLed at {r0['kill_at']:g} s; 2 s per request; ok = a 200 with the key's body.")
    print("Hit ratio before the kill: 1 − upstream requests / requests (the application's own")
    print("count); after it no application exists, so every ok answer came from the cache.")
    print("Stale: forkd's `stale` counter after the kill, nginx's `X-Cache: STALE`/`UPDATING`, Varnish's")
    print("answers from an expired object (`X-Cache: STALE`).")
    print()
    print("| route | server | requests before / after | failed before / after | upstream requests before / after | hit ratio before | answered from cache after | stale served after | p99 ms before / after | the server's counters after the kill |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for v in ["swr", "strict"]:
        for s in SERVERS:
            for r in [r for r in rs if r["variant"] == v and r["server"] == s]:
                b, a = r["before"], r["after"]
                hit = 1 - b["upstream_requests"] / b["requests"] if b["requests"] else None
                served = a["ok"] / a["requests"] if a["requests"] else None
                after = r.get("counters_after") or {}
                if s == "forkd":
                    stale = after.get("stale", "?")
                else:
                    stale = sum(a["labels"].get(k, 0) for k in ("STALE", "UPDATING"))
                print(f"| {v} | {s} | {b['requests']} / {a['requests']} | **{b['failed']} / {a['failed']}** "
                      f"| {b['upstream_requests']} / {a['upstream_requests']} | {fmt(hit, 3)} | {fmt(served, 3)} "
                      f"| {stale} | {b.get('p99_ms', '-')} / {a.get('p99_ms', '-')} | {server_counters(r, after)} |")
    print()


def main():
    records = load(sys.argv[1])
    cpu(records)
    stampede(records)
    kill(records)


if __name__ == "__main__":
    main()
