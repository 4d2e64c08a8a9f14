"""The harness of the HTTP/2 conformance checks (h2spec's equivalent, tests/h2/).

A check is a function taking a `Ctx` and raising `Failed("expected ..., saw ...")`;
`@check("6.5.3/2", "title")` registers it. `run.py GROUP` runs a group's checks
one by one, each on fresh connections, and prints one line per check:

    ok   6.5.3/2  Sends a SETTINGS frame without ACK flag
    FAIL 6.9.1/2  Sends WINDOW_UPDATE ... : expected GOAWAY(FLOW_CONTROL_ERROR), saw ...

Frames we send are built by hand (`frame()`): most checks send what hyperframe
refuses to serialise. Frames the server sends are parsed with hyperframe; every
header block is decoded with one hpack decoder per connection, in order, as the
RFC requires.
"""

import json
import os
import socket
import ssl
import struct
import subprocess
import threading
import time

import hpack
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PushPromiseFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

# SETTINGS identifiers.
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 1, 2, 3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 4, 5, 6

# Error codes (RFC 9113 §7).
CODES = {
    0x0: "NO_ERROR",
    0x1: "PROTOCOL_ERROR",
    0x2: "INTERNAL_ERROR",
    0x3: "FLOW_CONTROL_ERROR",
    0x4: "SETTINGS_TIMEOUT",
    0x5: "STREAM_CLOSED",
    0x6: "FRAME_SIZE_ERROR",
    0x7: "REFUSED_STREAM",
    0x8: "CANCEL",
    0x9: "COMPRESSION_ERROR",
    0xA: "CONNECT_ERROR",
    0xB: "ENHANCE_YOUR_CALM",
    0xC: "INADEQUATE_SECURITY",
    0xD: "HTTP_1_1_REQUIRED",
}
NAMES = {v: k for k, v in CODES.items()}
globals().update(NAMES)

# How long a check waits for what it expects (a loaded 2-core machine). Passing
# checks never wait this long: the answer comes at once.
WAIT = float(os.environ.get("H2_WAIT", "5"))


def code_name(code):
    return CODES.get(code, "0x%x" % code)


class Failed(Exception):
    pass


class Closed(Exception):
    """The server closed (or reset) the connection."""


def frame(kind, flags, stream, payload=b"", length=None):
    """One frame's bytes; `length` overrides the length field (a lie, on purpose)."""
    n = len(payload) if length is None else length
    return struct.pack(">I", n)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def settings(*pairs, ack=False):
    return frame(SETTINGS, ACK if ack else 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


def ping(data=b"h2check!", ack=False, stream=0):
    return frame(PING, ACK if ack else 0, stream, data)


def window_update(stream, increment):
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def rst(stream, code=CANCEL):
    return frame(RST_STREAM, 0, stream, struct.pack(">I", code))


def goaway(last=0, code=NO_ERROR, stream=0):
    return frame(GOAWAY, 0, stream, struct.pack(">II", last, code))


def priority(stream, depends=0, weight=16, exclusive=False):
    dep = depends | (0x80000000 if exclusive else 0)
    return frame(PRIORITY, 0, stream, struct.pack(">IB", dep, weight))


def describe(f):
    """A frame as a check's message names it."""
    if isinstance(f, GoAwayFrame):
        extra = (", %r" % bytes(f.additional_data)) if f.additional_data else ""
        return "GOAWAY(%s, last %d%s)" % (code_name(f.error_code), f.last_stream_id, extra)
    if isinstance(f, RstStreamFrame):
        return "RST_STREAM(%s) on %d" % (code_name(f.error_code), f.stream_id)
    flags = ",".join(sorted(f.flags))
    name = type(f).__name__.replace("Frame", "").upper()
    return "%s[%s] on %d (%d octets)" % (name, flags, f.stream_id, getattr(f, "body_len", 0))


class Response:
    def __init__(self):
        self.headers = []
        self.trailers = []
        self.data = bytearray()
        self.data_frames = []
        self.ended = False
        self.reset = None

    def header(self, name):
        for k, v in self.headers:
            if k == name:
                return v
        return None

    @property
    def echoed(self):
        """The request body the echo upstream answers with (after its copy of the
        request head)."""
        data = bytes(self.data)
        return data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else None

    @property
    def status(self):
        s = self.header(":status")
        return int(s) if s is not None else None


class Conn:
    """One client connection speaking raw frames."""

    def __init__(self, ctx, tls=False):
        self.ctx = ctx
        raw = socket.create_connection(("127.0.0.1", ctx.port), timeout=WAIT)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls:
            tls_ctx = ssl.create_default_context(cafile=ctx.ca)
            tls_ctx.set_alpn_protocols(["h2"])
            raw = tls_ctx.wrap_socket(raw, server_hostname="localhost")
        self.sock = raw
        self.buf = bytearray()
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.block = None  # (stream, bytes) of a header block being received
        self.responses = {}
        self.seen = []  # every frame received, described
        self.server_settings = {}
        self.closed = False
        self.auto_window = True
        self.lock = threading.Lock()

    # -- sending ---------------------------------------------------------------

    def send(self, *chunks):
        try:
            with self.lock:
                self.sock.sendall(b"".join(chunks))
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError) as e:
            if isinstance(e, socket.timeout):
                raise
            if not self.closed:
                self.seen.append("write failed (%s)" % e.__class__.__name__)
            self.closed = True
            raise Closed(str(e))

    def handshake(self, *pairs, preface=PREFACE):
        """The preface and our SETTINGS; waits for the server's SETTINGS, ACKs them,
        and waits for the ACK of ours."""
        self.send(preface, settings(*pairs))
        got_settings = got_ack = False
        deadline = time.monotonic() + WAIT
        while not (got_settings and got_ack):
            f = self.next_frame(deadline)
            if f is None:
                raise Failed("no SETTINGS exchange within %.0fs; saw %s" % (WAIT, self.seen))
            if isinstance(f, SettingsFrame):
                if "ACK" in f.flags:
                    got_ack = True
                else:
                    got_settings = True
        return self

    def headers_block(self, headers):
        return self.encoder.encode(headers)

    def request_headers(self, method="GET", path="/", extra=(), authority="localhost"):
        return [
            (":method", method),
            (":scheme", "http"),
            (":path", path),
            (":authority", authority),
        ] + list(extra)

    def headers(self, stream, headers, end_stream=True, end_headers=True, flags=0):
        """A HEADERS frame for `headers` (a list of pairs, or raw block bytes)."""
        block = headers if isinstance(headers, (bytes, bytearray)) else self.headers_block(headers)
        flags |= (END_STREAM if end_stream else 0) | (END_HEADERS if end_headers else 0)
        return frame(HEADERS, flags, stream, bytes(block))

    def get(self, stream, path="/", method="GET", extra=(), end_stream=True):
        return self.headers(stream, self.request_headers(method, path, extra), end_stream)

    # -- receiving -------------------------------------------------------------

    def _read_some(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return False
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError, OSError) as e:
            self.closed = True
            self.seen.append("reset (%s)" % e.__class__.__name__)
            raise Closed("reset")
        if not data:
            self.closed = True
            self.seen.append("EOF")
            raise Closed("EOF")
        self.buf += data
        return True

    def next_frame(self, deadline):
        """The next frame (hyperframe), or None at the deadline; raises Closed."""
        while True:
            if len(self.buf) >= 9:
                f, length = Frame.parse_frame_header(memoryview(self.buf[:9]))
                if len(self.buf) >= 9 + length:
                    body = bytes(self.buf[9 : 9 + length])
                    del self.buf[: 9 + length]
                    f.parse_body(memoryview(body))
                    f.body_len = length
                    self._on_frame(f)
                    return f
            if not self._read_some(deadline):
                return None

    def _on_frame(self, f):
        self.seen.append(describe(f))
        if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
            self.server_settings.update(f.settings)
            self.send(settings(ack=True))
        elif isinstance(f, PingFrame) and "ACK" not in f.flags:
            self.send(ping(f.opaque_data, ack=True))
        elif isinstance(f, (HeadersFrame, PushPromiseFrame)):
            self.block = (f.stream_id, bytearray(f.data))
            self._pending_end = "END_STREAM" in f.flags
            if "END_HEADERS" in f.flags:
                self._end_block(self._pending_end)
        elif isinstance(f, ContinuationFrame) and self.block:
            self.block[1].extend(f.data)
            if "END_HEADERS" in f.flags:
                self._end_block(self._pending_end)
        elif isinstance(f, DataFrame):
            r = self.responses.setdefault(f.stream_id, Response())
            r.data += f.data
            r.data_frames.append(len(f.data))
            if "END_STREAM" in f.flags:
                r.ended = True
            if self.auto_window and f.flow_controlled_length:
                n = f.flow_controlled_length
                self.send(window_update(0, n), window_update(f.stream_id, n))
        elif isinstance(f, RstStreamFrame):
            self.responses.setdefault(f.stream_id, Response()).reset = f.error_code

    def _end_block(self, end_stream):
        stream, block = self.block
        self.block = None
        headers = self.decoder.decode(bytes(block))
        r = self.responses.setdefault(stream, Response())
        if r.headers and not str(r.headers[0][1]).startswith("1"):
            r.trailers = headers
        elif r.headers:
            r.headers = headers  # an interim (1xx) response, then the final one
        else:
            r.headers = headers
        if end_stream:
            r.ended = True

    def wait_for(self, pred, what, timeout=WAIT):
        """Reads until `pred(frame)`; returns that frame. Fails at the deadline or on
        close, naming what was seen."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                f = self.next_frame(deadline)
            except Closed:
                raise Failed("expected %s, saw %s" % (what, self.trace()))
            if f is None:
                raise Failed("expected %s within %.0fs, saw %s" % (what, timeout, self.trace()))
            if pred(f):
                return f

    def trace(self):
        seen = [s for s in self.seen if not s.startswith(("SETTINGS", "WINDOW_UPDATE"))]
        return "[" + ", ".join(seen[-12:]) + "]" if seen else "nothing"

    def response(self, stream, timeout=WAIT):
        """Reads until stream `stream` ended (or was reset); its Response."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.responses.get(stream)
            if r and (r.ended or r.reset is not None):
                return r
            try:
                f = self.next_frame(deadline)
            except Closed:
                raise Failed("expected a response on stream %d, saw %s" % (stream, self.trace()))
            if f is None:
                raise Failed(
                    "expected a response on stream %d within %.0fs, saw %s"
                    % (stream, timeout, self.trace())
                )

    # -- verdicts (h2spec's) ---------------------------------------------------

    def expect_connection_error(self, *codes):
        """GOAWAY with one of `codes`, then the connection closes. The RFC lets the
        endpoint close without GOAWAY too (§5.4.1 'SHOULD send'), so a plain close
        passes, as in h2spec."""
        names = "/".join(code_name(c) for c in codes)
        deadline = time.monotonic() + WAIT
        while True:
            try:
                f = self.next_frame(deadline)
            except Closed:
                return
            if f is None:
                raise Failed("expected GOAWAY(%s) or a close, saw %s" % (names, self.trace()))
            if isinstance(f, GoAwayFrame):
                if f.error_code not in codes:
                    self.other_code(names, f)
                return
            if isinstance(f, RstStreamFrame):
                raise Failed("expected GOAWAY(%s) (a connection error), saw %s" % (names, describe(f)))

    def other_code(self, names, f):
        """A connection error with another code than the RFC names: h2spec passes it
        (it accepts the close that follows), so do we, with a note."""
        try:
            self.wait_for(lambda _: False, "the close after %s" % describe(f))
        except Failed:
            if not self.closed:
                raise
        self.ctx.note("GOAWAY(%s) where the RFC names %s" % (code_name(f.error_code), names))

    def expect_stream_error(self, stream, *codes, connection_ok=True):
        """RST_STREAM on `stream` with one of `codes`. A connection error with the
        same code also passes (RFC 9113 §5.4.1: an endpoint MAY treat a stream
        error as a connection error), unless `connection_ok` is False."""
        names = "/".join(code_name(c) for c in codes)
        deadline = time.monotonic() + WAIT
        while True:
            try:
                f = self.next_frame(deadline)
            except Closed:
                if connection_ok:
                    return
                raise Failed("expected RST_STREAM(%s) on %d, saw %s" % (names, stream, self.trace()))
            if f is None:
                raise Failed("expected RST_STREAM(%s) on %d, saw %s" % (names, stream, self.trace()))
            if isinstance(f, RstStreamFrame) and f.stream_id == stream:
                if f.error_code in codes:
                    return
                raise Failed("expected RST_STREAM(%s) on %d, saw %s" % (names, stream, describe(f)))
            if isinstance(f, GoAwayFrame):
                if not connection_ok:
                    raise Failed("expected RST_STREAM(%s) on %d, saw %s" % (names, stream, describe(f)))
                if f.error_code not in codes:
                    self.other_code(names, f)
                else:
                    self.ctx.note("a connection error GOAWAY(%s) for a stream error" % names)
                return
            if isinstance(f, HeadersFrame) and f.stream_id == stream:
                r = self.responses.get(stream)
                status = r.status if r and r.headers else "?"
                raise Failed(
                    "expected RST_STREAM(%s) on %d, saw a response (:status %s)" % (names, stream, status)
                )

    def expect_alive(self, what="the connection still serves"):
        """A PING is answered: whatever came before was ignored, not an error."""
        data = os.urandom(8)
        try:
            self.send(ping(data))
        except Closed:
            raise Failed("expected %s (PING ACK), saw %s" % (what, self.trace()))

        def is_ack(f):
            if isinstance(f, GoAwayFrame):
                raise Failed("expected %s (PING ACK), saw %s" % (what, describe(f)))
            return isinstance(f, PingFrame) and "ACK" in f.flags and f.opaque_data == data

        self.wait_for(is_ack, "%s (PING ACK)" % what)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Ctx:
    """What a check knows of the daemon: its port, site, binary and config."""

    def __init__(self):
        self.port = int(os.environ["H2_PORT"])
        self.www = os.environ.get("H2_WWW", "")
        self.bin = os.environ.get("H2_FORKD", "")
        self.config = os.environ.get("H2_CONFIG", "")
        self.ca = os.environ.get("H2_CA", "")
        self.conns = []
        self.notes = []

    def note(self, text):
        """A deviation from the RFC's letter that h2spec accepts: reported, not failed."""
        self.notes.append(text)

    def conn(self, *pairs, handshake=True, tls=False):
        c = Conn(self, tls=tls)
        self.conns.append(c)
        if handshake:
            c.handshake(*pairs)
        return c

    def file(self, name):
        with open(os.path.join(self.www, name), "rb") as f:
            return f.read()

    def stats(self):
        out = subprocess.run(
            [self.bin, "stats", "-c", self.config, "--json"], capture_output=True, timeout=30
        )
        if out.returncode != 0:
            raise Failed("forkd stats failed: %s" % out.stderr.decode(errors="replace"))
        return json.loads(out.stdout)

    def counter(self, name):
        return int(self.stats()["totals"].get(name, 0))

    def expect_counter_above(self, name, before):
        """Polls the stats until counter `name` exceeds `before`."""
        deadline = time.monotonic() + 2 * WAIT
        while True:
            now = self.counter(name)
            if now > before:
                return now
            if time.monotonic() > deadline:
                raise Failed("expected stats %s above %d, saw %d" % (name, before, now))
            time.sleep(0.05)

    def expect_counter_above_sum(self, names, before):
        """Polls the stats until the sum of counters `names` exceeds `before`."""
        deadline = time.monotonic() + 2 * WAIT
        while True:
            totals = self.stats()["totals"]
            now = sum(int(totals.get(n, 0)) for n in names)
            if now > before:
                return now
            if time.monotonic() > deadline:
                raise Failed("expected stats %s above %d, saw %d" % (" + ".join(names), before, now))
            time.sleep(0.05)

    def close_all(self):
        for c in self.conns:
            c.close()
        self.conns = []


CHECKS = []


def check(ident, title):
    def register(fn):
        CHECKS.append((fn.__module__, ident, title, fn))
        return fn

    return register
