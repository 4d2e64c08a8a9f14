"""RFC 9113 §3.5 (preface), §4 (frame format, size, header compression), §5 (stream
states, identifiers, concurrency, dependencies, error handling, extensions)."""

import struct

from h2conf import *  # noqa: F401,F403
from h2conf import check, code_name, describe, frame, ping, priority, rst, settings, window_update


# -- 3.5 HTTP/2 Connection Preface ---------------------------------------------------


@check("3.5/1", "Sends client connection preface")
def preface_ok(ctx):
    c = ctx.conn()
    c.expect_alive()


@check("3.5/2", "Sends invalid connection preface")
def preface_invalid(ctx):
    c = ctx.conn(handshake=False)
    c.send(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", settings())
    c.expect_connection_error(PROTOCOL_ERROR)


@check("3.5/3", "Sends a preface not followed by SETTINGS")
def preface_then_ping(ctx):
    # RFC 9113 §3.4: the preface MUST be followed by SETTINGS; h2spec has no such
    # check. A server answering the PING is a deviation noted, not a failure.
    c = ctx.conn(handshake=False)
    c.send(PREFACE, ping(b"firstpng"))
    f = c.wait_for(
        lambda f: isinstance(f, GoAwayFrame) or (isinstance(f, PingFrame) and "ACK" in f.flags),
        "GOAWAY(PROTOCOL_ERROR)",
    )
    if isinstance(f, PingFrame):
        ctx.note("a PING before the client's SETTINGS was answered (RFC 9113 §3.4: PROTOCOL_ERROR)")
    elif f.error_code != PROTOCOL_ERROR:
        raise Failed("expected GOAWAY(PROTOCOL_ERROR), saw %s" % describe(f))


# -- 4.1 Frame Format ------------------------------------------------------------------


@check("4.1/1", "Sends a frame with unknown type")
def unknown_type(ctx):
    c = ctx.conn()
    c.send(frame(0x16, 0, 0, b"\x00" * 8))
    c.expect_alive()


@check("4.1/2", "Sends a frame with undefined flag")
def undefined_flag(ctx):
    c = ctx.conn()
    c.send(frame(PING, 0x16, 0, b"\x00" * 8))
    c.wait_for(lambda f: isinstance(f, PingFrame) and "ACK" in f.flags, "PING ACK")
    c.expect_alive()


@check("4.1/3", "Sends a frame with reserved field bit")
def reserved_bit(ctx):
    c = ctx.conn()
    # The reserved bit set in front of stream 1's id: received as stream 1.
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 0x80000001, bytes(c.headers_block(c.request_headers()))))
    r = c.response(1)
    if r.status != 200:
        raise Failed("expected :status 200 on stream 1, saw %s" % r.headers)


# -- 4.2 Frame Size --------------------------------------------------------------------


@check("4.2/1", "Sends a DATA frame with 2^14 octets in length")
def data_max_size(ctx):
    c = ctx.conn()
    c.send(c.get(1, "/echo", "POST", end_stream=False), frame(DATA, END_STREAM, 1, b"x" * 16384))
    r = c.response(1)
    if r.status != 200 or r.echoed != b"x" * 16384:
        raise Failed("expected 200 echoing 16384 octets, saw %s, %r" % (r.status, r.echoed and len(r.echoed)))


@check("4.2/2", "Sends a large size DATA frame that exceeds SETTINGS_MAX_FRAME_SIZE")
def data_too_large(ctx):
    c = ctx.conn()
    c.send(c.get(1, "/echo", "POST", end_stream=False), frame(DATA, END_STREAM, 1, b"x" * 16385))
    c.expect_connection_error(FRAME_SIZE_ERROR)


@check("4.2/3", "Sends a large size HEADERS frame that exceeds SETTINGS_MAX_FRAME_SIZE")
def headers_too_large(ctx):
    c = ctx.conn()
    extra = [("x-fill-%d" % i, "v" * 100) for i in range(170)]
    block = bytes(c.headers_block(c.request_headers(extra=extra)))
    if len(block) <= 16384:
        raise Failed("the check's block is only %d octets" % len(block))
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, block))
    c.expect_connection_error(FRAME_SIZE_ERROR)


@check("4.2/4", "Sends a SETTINGS frame larger than SETTINGS_MAX_FRAME_SIZE")
def settings_too_large(ctx):
    c = ctx.conn()
    c.send(frame(SETTINGS, 0, 0, b"\x00\x63\x00\x00\x00\x00" * 2731))
    c.expect_connection_error(FRAME_SIZE_ERROR)


# -- 4.3 Header Compression and Decompression ------------------------------------------


@check("4.3/1", "Sends invalid header block fragment")
def invalid_block(ctx):
    c = ctx.conn()
    # A literal with incremental indexing whose name length runs past the block.
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, b"\x40\x7f\xff\xff\xff\x0f"))
    c.expect_connection_error(COMPRESSION_ERROR)


@check("4.3/2", "Sends a PRIORITY frame while sending the header blocks")
def priority_inside_block(ctx):
    c = ctx.conn()
    c.send(c.headers(1, c.request_headers(), end_headers=False), priority(1))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("4.3/3", "Sends a HEADERS frame to another stream while sending the header blocks")
def headers_inside_block(ctx):
    c = ctx.conn()
    c.send(c.headers(1, c.request_headers(), end_headers=False), c.get(3))
    c.expect_connection_error(PROTOCOL_ERROR)


# -- 5.1 Stream States -----------------------------------------------------------------


@check("5.1/1", "idle: Sends a DATA frame")
def idle_data(ctx):
    c = ctx.conn()
    c.send(frame(DATA, END_STREAM, 1, b"test"))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("5.1/2", "idle: Sends a RST_STREAM frame")
def idle_rst(ctx):
    c = ctx.conn()
    c.send(rst(1))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("5.1/3", "idle: Sends a WINDOW_UPDATE frame")
def idle_window_update(ctx):
    c = ctx.conn()
    c.send(window_update(1, 100))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("5.1/4", "idle: Sends a CONTINUATION frame")
def idle_continuation(ctx):
    c = ctx.conn()
    c.send(frame(CONTINUATION, END_HEADERS, 1, bytes(c.headers_block(c.request_headers()))))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("5.1/5", "half closed (remote): Sends a DATA frame")
def half_closed_data(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(c.get(1, "/big.bin"), frame(DATA, END_STREAM, 1, b"test"))
    c.expect_stream_error(1, STREAM_CLOSED)


@check("5.1/6", "half closed (remote): Sends a HEADERS frame")
def half_closed_headers(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(c.get(1, "/big.bin"), c.get(1, "/big.bin"))
    c.expect_stream_error(1, STREAM_CLOSED)


@check("5.1/7", "half closed (remote): Sends a CONTINUATION frame")
def half_closed_continuation(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(
        c.get(1, "/big.bin"),
        frame(CONTINUATION, END_HEADERS, 1, bytes(c.headers_block([("x-test", "ok")]))),
    )
    c.expect_connection_error(PROTOCOL_ERROR, STREAM_CLOSED)


@check("5.1/8", "closed: Sends a DATA frame after sending RST_STREAM frame")
def closed_rst_data(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(c.get(1, "/echo", "POST", end_stream=False), rst(1), frame(DATA, END_STREAM, 1, b"test"))
    c.expect_stream_error(1, STREAM_CLOSED)


@check("5.1/9", "closed: Sends a HEADERS frame after sending RST_STREAM frame")
def closed_rst_headers(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(c.get(1, "/echo", "POST", end_stream=False), rst(1), c.get(1))
    c.expect_connection_error(STREAM_CLOSED, PROTOCOL_ERROR)


@check("5.1/10", "closed: Sends a CONTINUATION frame after sending RST_STREAM frame")
def closed_rst_continuation(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(
        c.get(1, "/echo", "POST", end_stream=False),
        rst(1),
        frame(CONTINUATION, END_HEADERS, 1, bytes(c.headers_block([("x-test", "ok")]))),
    )
    c.expect_connection_error(STREAM_CLOSED, PROTOCOL_ERROR)


def finished(ctx):
    c = ctx.conn()
    c.send(c.get(1))
    r = c.response(1)
    if r.status != 200:
        raise Failed("expected :status 200 on stream 1, saw %s" % r.headers)
    return c


@check("5.1/11", "closed: Sends a DATA frame")
def closed_data(ctx):
    c = finished(ctx)
    c.send(frame(DATA, END_STREAM, 1, b"test"))
    c.expect_stream_error(1, STREAM_CLOSED)


@check("5.1/12", "closed: Sends a HEADERS frame")
def closed_headers(ctx):
    c = finished(ctx)
    c.send(c.get(1))
    c.expect_connection_error(STREAM_CLOSED, PROTOCOL_ERROR)


@check("5.1/13", "closed: Sends a CONTINUATION frame")
def closed_continuation(ctx):
    c = finished(ctx)
    c.send(frame(CONTINUATION, END_HEADERS, 1, bytes(c.headers_block([("x-test", "ok")]))))
    c.expect_connection_error(STREAM_CLOSED, PROTOCOL_ERROR)


# -- 5.1.1 Stream Identifiers ----------------------------------------------------------


@check("5.1.1/1", "Sends even-numbered stream identifier")
def even_stream(ctx):
    c = ctx.conn()
    c.send(c.get(2))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("5.1.1/2", "Sends stream identifier that is numerically smaller than previous")
def smaller_stream(ctx):
    c = ctx.conn()
    c.send(c.get(5))
    c.response(5)
    c.send(c.get(3))
    c.expect_connection_error(PROTOCOL_ERROR)


# -- 5.1.2 Stream Concurrency ----------------------------------------------------------


@check("5.1.2/1", "Sends HEADERS frames that causes their advertised concurrent stream limit to be exceeded")
def concurrency_exceeded(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    limit = c.server_settings.get(MAX_CONCURRENT_STREAMS)
    if not limit:
        raise Failed("expected SETTINGS_MAX_CONCURRENT_STREAMS from the server, saw %s" % c.server_settings)
    before = ctx.counter("h2_refused_streams")
    # Each stream waits on our window of 0: all stay open.
    c.send(*[c.get(2 * i + 1, "/big.bin") for i in range(limit + 1)])
    last = 2 * limit + 1
    c.expect_stream_error(last, REFUSED_STREAM, PROTOCOL_ERROR, connection_ok=False)
    c.expect_alive()
    ctx.expect_counter_above("h2_refused_streams", before)


# -- 5.3.1 Stream Dependencies ---------------------------------------------------------


@check("5.3.1/1", "Sends HEADERS frame that depends on itself")
def headers_self_dependency(ctx):
    c = ctx.conn()
    block = bytes(c.headers_block(c.request_headers()))
    c.send(frame(HEADERS, END_STREAM | END_HEADERS | PRIORITY_FLAG, 1, struct.pack(">IB", 1, 16) + block))
    c.expect_stream_error(1, PROTOCOL_ERROR)


@check("5.3.1/2", "Sends PRIORITY frame that depend on itself")
def priority_self_dependency(ctx):
    c = ctx.conn()
    c.send(priority(1, depends=1))
    c.expect_stream_error(1, PROTOCOL_ERROR)


# -- 5.4.1 Connection Error Handling ---------------------------------------------------


@check("5.4.1/1", "Sends an invalid PING frame for connection close")
def connection_error_closes(ctx):
    c = ctx.conn()
    c.send(ping(b"\x00" * 6))
    c.wait_for(lambda f: isinstance(f, GoAwayFrame), "GOAWAY(FRAME_SIZE_ERROR)")
    # After GOAWAY for an error the server MUST close the connection.
    try:
        c.wait_for(lambda f: False, "the connection closed after GOAWAY")
    except Failed:
        if not c.closed:
            raise


@check("5.4.1/2", "Sends an invalid PING frame to receive GOAWAY frame")
def connection_error_goaway(ctx):
    c = ctx.conn()
    c.send(c.get(1))
    c.response(1)
    c.send(ping(b"\x00" * 6))
    f = c.wait_for(lambda f: isinstance(f, GoAwayFrame), "GOAWAY(FRAME_SIZE_ERROR, last 1)")
    if f.last_stream_id != 1:
        raise Failed("expected GOAWAY naming stream 1 as the last, saw %s" % describe(f))
    if f.error_code != FRAME_SIZE_ERROR:
        ctx.note("GOAWAY(%s) where the RFC names FRAME_SIZE_ERROR" % code_name(f.error_code))


# -- 5.5 Extending HTTP/2 --------------------------------------------------------------


@check("5.5/1", "Sends an unknown extension frame")
def unknown_extension(ctx):
    c = ctx.conn()
    c.send(frame(0xFF, 0, 0, b"\x00" * 8), frame(0xFF, 0xFF, 1, b"x" * 100))
    c.expect_alive()


@check("5.5/2", "Sends an unknown extension frame in the middle of a header block")
def unknown_extension_in_block(ctx):
    c = ctx.conn()
    c.send(c.headers(1, c.request_headers(), end_headers=False), frame(0xFF, 0, 1, b"\x00" * 8))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("5.5/3", "Sends an unknown SETTINGS identifier")
def unknown_setting(ctx):
    c = ctx.conn((0xFF, 1), (0x99, 12345))
    c.expect_alive()
