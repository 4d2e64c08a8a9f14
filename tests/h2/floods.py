"""Floods and abuse: each is bounded, closes the connection with
GOAWAY(ENHANCE_YOUR_CALM) (or PROTOCOL_ERROR where the RFC says so), is counted in
the stats, and leaves the server serving others. Every flood is bounded in bytes
and time: it stops by itself."""

import select
import threading
import time

from h2conf import *  # noqa: F401,F403
from h2conf import Frame, check, code_name, describe, frame, ping, priority, rst, settings, window_update

# The most any flood sends before it counts as not stopped (the control rule closes
# past 8 x useful bytes + 1 MiB: ~9 MiB of pure control frames).
MAX_FLOOD = 24 << 20


class Flood:
    """A connection flooded from this thread while another drains what the server
    sends (it must not stall on a full socket), until the server closes it."""

    def __init__(self, ctx, *pairs):
        self.c = ctx.conn(*pairs)
        self.c.auto_window = False
        # Sends may wait on the server's reading for long; reads poll (select).
        self.c.sock.settimeout(60)
        self.goaways = []
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()
        self.sent = 0

    def _drain(self):
        """Reads as fast as the server writes, looking at frame headers only (the
        flood's answers, ACKs and pongs, are many); keeps GOAWAY frames."""
        sock = self.c.sock
        buf = bytearray(self.c.buf)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            while len(buf) >= 9:
                length = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + length:
                    break
                if buf[3] == GOAWAY:
                    f, _ = Frame.parse_frame_header(memoryview(buf[:9]))
                    f.parse_body(memoryview(bytes(buf[9 : 9 + length])))
                    f.body_len = length
                    self.goaways.append(f)
                    self.c.seen.append(describe(f))
                del buf[: 9 + length]
            try:
                if not select.select([sock], [], [], 1)[0]:
                    continue
                data = sock.recv(1 << 20)
            except (OSError, ValueError) as e:
                self.c.seen.append("reset (%s)" % e.__class__.__name__)
                return
            if not data:
                self.c.seen.append("EOF")
                return
            buf += data

    def run(self, chunk, limit=MAX_FLOOD, pieces=None):
        """Sends `chunk` (or the next of `pieces`) until the connection closes or
        `limit` octets went."""
        it = iter(pieces) if pieces is not None else None
        while self.sent < limit and self.reader.is_alive():
            data = chunk if it is None else next(it, None)
            if data is None:
                break
            try:
                self.c.send(data)
            except (Closed, OSError):
                break
            self.sent += len(data)
        self.reader.join(3 * WAIT)
        return self

    def expect_closed(self, ctx, counter, before, *codes):
        names = "/".join(code_name(c) for c in codes)
        if self.reader.is_alive():
            raise Failed(
                "expected the connection closed with GOAWAY(%s) after a flood, still open after %d octets"
                % (names, self.sent)
            )
        errors = [g for g in self.goaways if g.error_code != NO_ERROR]
        if not errors:
            raise Failed(
                "expected GOAWAY(%s) before the close, saw %s after %d octets"
                % (names, self.c.trace(), self.sent)
            )
        self.first_error = describe(errors[0])
        if errors[0].error_code not in codes:
            raise Failed("expected GOAWAY(%s), saw %s" % (names, describe(errors[0])))
        try:
            ctx.expect_counter_above(counter, before)
        except Failed as e:
            raise Failed("%s (the connection was closed with %s)" % (e, self.first_error))
        # Others are still served.
        c = ctx.conn()
        c.send(c.get(1, "/index.html"))
        if c.response(1).status != 200:
            raise Failed("expected a new connection served after the flood")


@check("flood/1", "Rapid reset (CVE-2023-44487): HEADERS + RST_STREAM at full speed")
def rapid_reset(ctx):
    before = ctx.counter("h2_flood_rapid_reset")
    f = Flood(ctx)
    c = f.c

    def pairs():
        stream = 1
        while stream < 2**31 - 200:
            batch = []
            for _ in range(50):
                batch.append(c.get(stream, "/big.bin") + rst(stream, CANCEL))
                stream += 2
            yield b"".join(batch)

    f.run(None, pieces=pairs())
    f.expect_closed(ctx, "h2_flood_rapid_reset", before, ENHANCE_YOUR_CALM)


@check("flood/2", "CONTINUATION flood: one header block in endless 1 KiB CONTINUATION frames")
def continuation_flood_large(ctx):
    before = ctx.counter("h2_flood_headers")
    f = Flood(ctx)
    c = f.c
    first = c.headers(1, c.request_headers(), end_stream=True, end_headers=False)
    # Literal fields without indexing, one per frame: a valid block that never ends.
    piece = b"\x00\x07x-flood" + bytes([0x7F, 0xE9, 0x06]) + b"v" * 1000
    f.c.send(first)
    f.run(frame(CONTINUATION, 0, 1, piece), limit=8 << 20)
    f.expect_closed(ctx, "h2_flood_headers", before, ENHANCE_YOUR_CALM, COMPRESSION_ERROR, PROTOCOL_ERROR)


@check("flood/3", "CONTINUATION flood: one header block in endless 1-octet CONTINUATION frames")
def continuation_flood_tiny(ctx):
    before = ctx.counter("h2_flood_headers")
    f = Flood(ctx)
    c = f.c
    f.c.send(c.headers(1, c.request_headers(), end_stream=True, end_headers=False))
    # Each frame one more indexed field (:method GET), decodable, never ending.
    f.run(frame(CONTINUATION, 0, 1, b"\x82") * 100, limit=4 << 20)
    f.expect_closed(ctx, "h2_flood_headers", before, ENHANCE_YOUR_CALM, COMPRESSION_ERROR, PROTOCOL_ERROR)


@check("flood/4", "HPACK bomb: a small block decoding to megabytes through the dynamic table")
def hpack_bomb(ctx):
    c = ctx.conn()
    before = ctx.counter("h2_protocol_errors") + ctx.counter("h2_stream_errors")
    base = bytes(c.headers_block(c.request_headers()))
    # One 4000-octet entry into the dynamic table, then 4000 one-octet references
    # to it: 16 MB decoded from a 12 KB block.
    entry = b"\x40\x06x-bomb" + b"\x7f\x81\x1e" + b"b" * 4000
    block = base + entry + b"\xbe" * 4000
    c.send(frame(HEADERS, END_STREAM, 1, block[:16000]), frame(CONTINUATION, END_HEADERS, 1, block[16000:]))
    deadline = time.monotonic() + WAIT
    verdict = None
    while verdict is None:
        try:
            fr = c.next_frame(deadline)
        except Closed:
            verdict = "closed without GOAWAY"
            break
        if fr is None:
            raise Failed("expected the bomb refused, saw %s" % c.trace())
        if isinstance(fr, GoAwayFrame):
            if fr.error_code not in (ENHANCE_YOUR_CALM, COMPRESSION_ERROR, PROTOCOL_ERROR):
                raise Failed("expected GOAWAY(ENHANCE_YOUR_CALM), saw %s" % describe(fr))
            verdict = describe(fr)
        elif isinstance(fr, RstStreamFrame) and fr.stream_id == 1:
            verdict = describe(fr)
        elif isinstance(fr, HeadersFrame) and fr.stream_id == 1:
            status = c.responses[1].status
            if status != 431:
                raise Failed("expected the bomb refused (431, RST_STREAM or GOAWAY), saw :status %s" % status)
            verdict = ":status 431"
    if verdict == "closed without GOAWAY":
        raise Failed("expected GOAWAY(ENHANCE_YOUR_CALM) or a refusal, saw %s" % c.trace())
    if verdict != ":status 431":
        ctx.expect_counter_above_sum(("h2_protocol_errors", "h2_stream_errors"), before)
    c2 = ctx.conn()
    c2.send(c2.get(1, "/index.html"))
    if c2.response(1).status != 200:
        raise Failed("expected a new connection served after the bomb")


def control_flood(ctx, chunk, counter="h2_flood_control", pairs=(), opener=None, burst=1 << 20):
    """`chunk` again and again; the connection must close, but not before `burst`
    octets: a client's legitimate burst of control frames passes."""
    before = ctx.counter(counter)
    f = Flood(ctx, *pairs)
    if opener:
        f.c.send(opener(f.c))
    f.run(chunk * 2000)
    f.expect_closed(ctx, counter, before, ENHANCE_YOUR_CALM)
    if f.sent < burst:
        raise Failed("closed after %d octets only: a legitimate burst of control frames must pass" % f.sent)


@check("flood/5", "SETTINGS flood: empty SETTINGS frames, each to be acknowledged")
def settings_flood(ctx):
    control_flood(ctx, settings())


@check("flood/6", "PING flood")
def ping_flood(ctx):
    control_flood(ctx, ping())


@check("flood/7", "PRIORITY flood")
def priority_flood(ctx):
    control_flood(ctx, priority(3, depends=5) + priority(5, depends=3))


@check("flood/8", "Empty DATA flood on an open stream")
def empty_data_flood(ctx):
    control_flood(
        ctx,
        frame(DATA, 0, 1, b""),
        opener=lambda c: c.get(1, "/echo", "POST", end_stream=False),
        burst=0,
    )


@check("flood/9", "Too many concurrent streams: REFUSED_STREAM, counted, the others served")
def too_many_streams(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    limit = c.server_settings.get(MAX_CONCURRENT_STREAMS)
    if not limit:
        raise Failed("expected SETTINGS_MAX_CONCURRENT_STREAMS from the server")
    before = ctx.counter("h2_refused_streams")
    extra = 3
    c.send(*[c.get(2 * i + 1, "/big.bin") for i in range(limit + extra)])
    for i in range(limit, limit + extra):
        c.expect_stream_error(2 * i + 1, REFUSED_STREAM, PROTOCOL_ERROR, connection_ok=False)
    after = ctx.expect_counter_above("h2_refused_streams", before + extra - 1)
    # The open ones complete once the window opens.
    c.auto_window = True
    c.send(settings((INITIAL_WINDOW_SIZE, 1 << 20)), window_update(0, 64 << 20))
    r = c.response(1, timeout=4 * WAIT)
    if bytes(r.data) != ctx.file("big.bin"):
        raise Failed("expected stream 1 complete after the refusals, saw %d octets" % len(r.data))
    del after
