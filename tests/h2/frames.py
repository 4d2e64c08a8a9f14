"""RFC 9113 §6 (every frame type's rules: DATA, HEADERS, PRIORITY, RST_STREAM,
SETTINGS and its values and synchronisation, PUSH_PROMISE, PING, GOAWAY,
WINDOW_UPDATE and flow control, CONTINUATION) and §7 (error codes)."""

import struct
import threading

from h2conf import *  # noqa: F401,F403
from h2conf import (
    check,
    code_name,
    describe,
    frame,
    goaway,
    ping,
    priority,
    rst,
    settings,
    window_update,
)


def post(c, stream=1):
    """HEADERS of a POST to the echo route, the body to follow."""
    return c.get(stream, "/echo", "POST", end_stream=False)


def first_data(c, stream):
    f = c.wait_for(lambda f: isinstance(f, DataFrame) and f.stream_id == stream, "DATA on %d" % stream)
    return f


# -- 6.1 DATA ------------------------------------------------------------------------


@check("6.1/1", "Sends a DATA frame with 0x0 stream identifier")
def data_stream_zero(ctx):
    c = ctx.conn()
    c.send(post(c), frame(DATA, END_STREAM, 0, b"test"))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.1/2", 'Sends a DATA frame on the stream that is not in "open" or "half-closed (local)" state')
def data_not_open(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(c.get(1, "/big.bin"), frame(DATA, END_STREAM, 1, b"test"))
    c.expect_stream_error(1, STREAM_CLOSED)


@check("6.1/3", "Sends a DATA frame with invalid pad length")
def data_bad_padding(ctx):
    c = ctx.conn()
    # Pad length 6 in a 5-octet payload.
    c.send(post(c), frame(DATA, END_STREAM | PADDED, 1, b"\x06test"))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.1/4", "Sends a padded DATA frame")
def data_padded(ctx):
    c = ctx.conn()
    c.send(post(c), frame(DATA, END_STREAM | PADDED, 1, b"\x04test\x00\x00\x00\x00"))
    r = c.response(1)
    if r.status != 200 or r.echoed != b"test":
        raise Failed("expected 200 echoing b'test', saw %s %r" % (r.status, r.echoed))


@check("6.1/5", "Sends multiple DATA frames, the last with END_STREAM")
def data_multiple(ctx):
    c = ctx.conn()
    c.send(post(c), frame(DATA, 0, 1, b"abc"), frame(DATA, 0, 1, b""), frame(DATA, END_STREAM, 1, b"def"))
    r = c.response(1)
    if r.echoed != b"abcdef":
        raise Failed("expected the echo b'abcdef', saw %s %r" % (r.status, r.echoed))


# -- 6.2 HEADERS ---------------------------------------------------------------------


@check("6.2/1", "Sends a HEADERS frame without the END_HEADERS flag, and a PRIORITY frame")
def headers_then_priority(ctx):
    c = ctx.conn()
    c.send(c.headers(1, c.request_headers(), end_headers=False), priority(1))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.2/2", "Sends a HEADERS frame to another stream while sending a HEADERS frame")
def headers_interleaved(ctx):
    c = ctx.conn()
    c.send(c.headers(1, c.request_headers(), end_headers=False), c.get(3))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.2/3", "Sends a HEADERS frame with 0x0 stream identifier")
def headers_stream_zero(ctx):
    c = ctx.conn()
    c.send(c.get(0))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.2/4", "Sends a HEADERS frame with invalid pad length")
def headers_bad_padding(ctx):
    c = ctx.conn()
    block = bytes(c.headers_block(c.request_headers()))
    c.send(frame(HEADERS, END_STREAM | END_HEADERS | PADDED, 1, bytes([len(block) + 1]) + block))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.2/5", "Sends a HEADERS frame with padding and priority")
def headers_padded_priority(ctx):
    c = ctx.conn()
    block = bytes(c.headers_block(c.request_headers()))
    payload = b"\x03" + struct.pack(">IB", 0, 200) + block + b"\x00\x00\x00"
    c.send(frame(HEADERS, END_STREAM | END_HEADERS | PADDED | PRIORITY_FLAG, 1, payload))
    r = c.response(1)
    if r.status != 200:
        raise Failed("expected :status 200, saw %s" % r.headers)


# -- 6.3 PRIORITY --------------------------------------------------------------------


@check("6.3/1", "Sends a PRIORITY frame with 0x0 stream identifier")
def priority_stream_zero(ctx):
    c = ctx.conn()
    c.send(priority(0, depends=1))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.3/2", "Sends a PRIORITY frame with a length other than 5 octets")
def priority_bad_length(ctx):
    c = ctx.conn()
    c.send(frame(PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10\x00"))
    c.expect_stream_error(1, FRAME_SIZE_ERROR)


@check("6.3/3", "Sends a PRIORITY frame on an idle and a closed stream")
def priority_any_state(ctx):
    c = ctx.conn()
    c.send(c.get(1))
    c.response(1)
    c.send(priority(1, depends=0), priority(9, depends=0), priority(7, depends=9, exclusive=True))
    c.expect_alive()
    c.send(c.get(3))
    if c.response(3).status != 200:
        raise Failed("expected stream 3 (below a PRIORITY's idle stream 9) to be served")


# -- 6.4 RST_STREAM ------------------------------------------------------------------


@check("6.4/1", "Sends a RST_STREAM frame with 0x0 stream identifier")
def rst_stream_zero(ctx):
    c = ctx.conn()
    c.send(rst(0))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.4/2", "Sends a RST_STREAM frame on a idle stream")
def rst_idle(ctx):
    c = ctx.conn()
    c.send(rst(3))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.4/3", "Sends a RST_STREAM frame with a length other than 4 octets")
def rst_bad_length(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(c.get(1, "/big.bin"), frame(RST_STREAM, 0, 1, b"\x00\x00\x00"))
    c.expect_connection_error(FRAME_SIZE_ERROR)


# -- 6.5 SETTINGS --------------------------------------------------------------------


@check("6.5/1", "Sends a SETTINGS frame with ACK flag and payload")
def settings_ack_payload(ctx):
    c = ctx.conn()
    c.send(frame(SETTINGS, ACK, 0, struct.pack(">HI", INITIAL_WINDOW_SIZE, 100)))
    c.expect_connection_error(FRAME_SIZE_ERROR)


@check("6.5/2", "Sends a SETTINGS frame with a stream identifier other than 0x0")
def settings_on_stream(ctx):
    c = ctx.conn()
    c.send(frame(SETTINGS, 0, 1, struct.pack(">HI", INITIAL_WINDOW_SIZE, 100)))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.5/3", "Sends a SETTINGS frame with a length other than a multiple of 6 octets")
def settings_bad_length(ctx):
    c = ctx.conn()
    c.send(frame(SETTINGS, 0, 0, struct.pack(">HI", INITIAL_WINDOW_SIZE, 100)[:5]))
    c.expect_connection_error(FRAME_SIZE_ERROR)


# -- 6.5.2 Defined SETTINGS Parameters -----------------------------------------------


@check("6.5.2/1", "SETTINGS_ENABLE_PUSH (0x2): Sends the value other than 0 or 1")
def settings_enable_push(ctx):
    c = ctx.conn()
    c.send(settings((ENABLE_PUSH, 2)))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.5.2/2", "SETTINGS_INITIAL_WINDOW_SIZE (0x4): Sends the value above the maximum flow control window size")
def settings_window_too_large(ctx):
    c = ctx.conn()
    c.send(settings((INITIAL_WINDOW_SIZE, 2**31)))
    c.expect_connection_error(FLOW_CONTROL_ERROR)


@check("6.5.2/3", "SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value below the initial value")
def settings_frame_size_small(ctx):
    c = ctx.conn()
    c.send(settings((MAX_FRAME_SIZE, 16383)))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.5.2/4", "SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value above the maximum allowed frame size")
def settings_frame_size_large(ctx):
    c = ctx.conn()
    c.send(settings((MAX_FRAME_SIZE, 2**24)))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.5.2/5", "Sends a SETTINGS frame with unknown identifier")
def settings_unknown(ctx):
    c = ctx.conn()
    c.send(settings((0xFF, 1)))
    c.wait_for(lambda f: isinstance(f, SettingsFrame) and "ACK" in f.flags, "SETTINGS ACK")
    c.expect_alive()


# -- 6.5.3 Settings Synchronization --------------------------------------------------


@check("6.5.3/1", "Sends multiple values of SETTINGS_INITIAL_WINDOW_SIZE")
def settings_last_value_wins(ctx):
    c = ctx.conn()
    c.auto_window = False
    c.send(settings((INITIAL_WINDOW_SIZE, 100), (INITIAL_WINDOW_SIZE, 1)))
    c.wait_for(lambda f: isinstance(f, SettingsFrame) and "ACK" in f.flags, "SETTINGS ACK")
    c.send(c.get(1, "/big.bin"))
    f = first_data(c, 1)
    if f.flow_controlled_length != 1:
        raise Failed("expected DATA of 1 octet (the last value), saw %s" % describe(f))


@check("6.5.3/2", "Sends a SETTINGS frame without ACK flag")
def settings_acked(ctx):
    c = ctx.conn()
    c.send(settings((INITIAL_WINDOW_SIZE, 100)))
    c.wait_for(lambda f: isinstance(f, SettingsFrame) and "ACK" in f.flags, "SETTINGS ACK")


# -- 6.6 PUSH_PROMISE ----------------------------------------------------------------


@check("6.6/1", "Sends a PUSH_PROMISE frame (a server does not accept them)")
def push_promise(ctx):
    c = ctx.conn()
    block = bytes(c.headers_block(c.request_headers()))
    c.send(c.get(1, "/big.bin"), frame(PUSH_PROMISE, END_HEADERS, 1, struct.pack(">I", 2) + block))
    c.expect_connection_error(PROTOCOL_ERROR)


# -- 6.7 PING ------------------------------------------------------------------------


@check("6.7/1", "Sends a PING frame")
def ping_answered(ctx):
    c = ctx.conn()
    c.send(ping(b"\x01\x02\x03\x04\x05\x06\x07\x08"))
    c.wait_for(
        lambda f: isinstance(f, PingFrame) and "ACK" in f.flags and f.opaque_data == b"\x01\x02\x03\x04\x05\x06\x07\x08",
        "PING ACK with the same data",
    )


@check("6.7/2", "Sends a PING frame with ACK")
def ping_ack_not_answered(ctx):
    c = ctx.conn()
    c.send(ping(b"unsolici", ack=True), ping(b"solicite"))
    f = c.wait_for(lambda f: isinstance(f, PingFrame), "PING ACK of b'solicite'")
    if f.opaque_data != b"solicite" or "ACK" not in f.flags:
        raise Failed("expected PING ACK of b'solicite' only, saw %s %r" % (describe(f), f.opaque_data))


@check("6.7/3", "Sends a PING frame with a stream identifier field value other than 0x0")
def ping_on_stream(ctx):
    c = ctx.conn()
    c.send(ping(stream=1))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.7/4", "Sends a PING frame with a length field value other than 8")
def ping_bad_length(ctx):
    c = ctx.conn()
    c.send(frame(PING, 0, 0, b"\x00" * 6))
    c.expect_connection_error(FRAME_SIZE_ERROR)


# -- 6.8 GOAWAY ----------------------------------------------------------------------


@check("6.8/1", "Sends a GOAWAY frame with a stream identifier other than 0x0")
def goaway_on_stream(ctx):
    c = ctx.conn()
    c.send(goaway(stream=1))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.8/2", "Sends a GOAWAY frame while a response is under way: the stream still completes")
def goaway_from_client(ctx):
    # RFC 9113 §6.8: a GOAWAY from the client names the last stream *the server*
    # initiated that it processed; streams the client opened still complete. The
    # client keeps writing (WINDOW_UPDATE, PING) while it reads, as clients do: the
    # server must not end the connection in a way that loses the response's end.
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 2**31 - 1)])
    c.send(window_update(0, 2**31 - 1 - 65535), c.get(1, "/big.bin"), goaway(last=0))
    stop = threading.Event()

    def pinger():
        while not stop.wait(0.002):
            try:
                c.send(ping(b"stillhre"))
            except (Closed, OSError):
                return

    t = threading.Thread(target=pinger, daemon=True)
    t.start()
    try:
        r = c.response(1)
    except Failed as e:
        got = len(c.responses[1].data) if 1 in c.responses else 0
        raise Failed("%s; %d of %d octets of stream 1 had arrived" % (e, got, len(ctx.file("big.bin"))))
    finally:
        stop.set()
        t.join()
    if r.status != 200 or len(r.data) != len(ctx.file("big.bin")):
        raise Failed("expected stream 1 to complete after our GOAWAY, saw %s, %d octets" % (r.status, len(r.data)))


# -- 6.9 WINDOW_UPDATE ---------------------------------------------------------------


@check("6.9/1", "Sends a WINDOW_UPDATE frame with a flow control window increment of 0")
def window_zero_conn(ctx):
    c = ctx.conn()
    c.send(window_update(0, 0))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.9/2", "Sends a WINDOW_UPDATE frame with a flow control window increment of 0 on a stream")
def window_zero_stream(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(c.get(1, "/big.bin"), window_update(1, 0))
    c.expect_stream_error(1, PROTOCOL_ERROR)


@check("6.9/3", "Sends a WINDOW_UPDATE frame with a length other than 4 octets")
def window_bad_length(ctx):
    c = ctx.conn()
    c.send(frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x01\x00"))
    c.expect_connection_error(FRAME_SIZE_ERROR)


# -- 6.9.1 The Flow-Control Window ---------------------------------------------------


@check("6.9.1/1", "Sends SETTINGS frame to set the initial window size to 1 and sends HEADERS frame")
def window_of_one(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 1)])
    c.auto_window = False
    c.send(c.get(1, "/big.bin"))
    f = first_data(c, 1)
    if f.flow_controlled_length != 1:
        raise Failed("expected DATA of 1 octet, saw %s" % describe(f))


@check("6.9.1/2", "Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1")
def window_overflow_conn(ctx):
    c = ctx.conn()
    c.send(window_update(0, 2**31 - 1), window_update(0, 2**31 - 1))
    c.expect_connection_error(FLOW_CONTROL_ERROR)


@check("6.9.1/3", "Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1 on a stream")
def window_overflow_stream(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(c.get(1, "/big.bin"), window_update(1, 2**31 - 1), window_update(1, 2**31 - 1))
    c.expect_stream_error(1, FLOW_CONTROL_ERROR)


@check("6.9.1/4", "A large file arrives whole as the window opens")
def window_opens(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 1000)])
    c.send(c.get(1, "/big.bin"))
    r = c.response(1, timeout=4 * WAIT)
    if bytes(r.data) != ctx.file("big.bin"):
        raise Failed("expected big.bin byte-identical, saw %d octets" % len(r.data))
    over = [n for n in r.data_frames if n > 16384]
    if over:
        raise Failed("expected DATA frames within SETTINGS_MAX_FRAME_SIZE, saw %s" % over[:3])


# -- 6.9.2 Initial Flow-Control Window Size ------------------------------------------


@check("6.9.2/1", "Changes SETTINGS_INITIAL_WINDOW_SIZE after sending HEADERS frame")
def window_raised_later(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.auto_window = False
    c.send(c.get(1, "/big.bin"))
    c.wait_for(lambda f: isinstance(f, HeadersFrame) and f.stream_id == 1, "HEADERS on 1")
    c.send(settings((INITIAL_WINDOW_SIZE, 1)))
    f = first_data(c, 1)
    if f.flow_controlled_length != 1:
        raise Failed("expected DATA of 1 octet, saw %s" % describe(f))


@check("6.9.2/2", "Sends a SETTINGS frame for window size to be negative")
def window_negative(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 3)])
    c.auto_window = False
    c.send(c.get(1, "/big.bin"))
    f = first_data(c, 1)
    if f.flow_controlled_length != 3:
        raise Failed("expected DATA of 3 octets, saw %s" % describe(f))
    # The window becomes 0 - 3 + 1 = ... negative by 2: nothing may come until the
    # WINDOW_UPDATE that raises it to 1.
    c.send(settings((INITIAL_WINDOW_SIZE, 1)), window_update(1, 3), ping(b"afterwin"))
    def sees(f):
        if isinstance(f, DataFrame) and f.stream_id == 1:
            return True
        return isinstance(f, PingFrame) and f.opaque_data == b"afterwin"
    f = c.wait_for(sees, "DATA of 1 octet on 1")
    if isinstance(f, PingFrame):
        f = first_data(c, 1)
    if f.flow_controlled_length != 1:
        raise Failed("expected DATA of 1 octet (window -2 + 3), saw %s" % describe(f))


@check("6.9.2/3", "Sends a SETTINGS_INITIAL_WINDOW_SIZE settings with an exceeded maximum window size value")
def window_setting_overflows_stream(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(c.get(1, "/big.bin"), window_update(1, 2**31 - 1))
    c.send(settings((INITIAL_WINDOW_SIZE, 2**31 - 1)))
    c.expect_connection_error(FLOW_CONTROL_ERROR)


# -- 6.10 CONTINUATION ---------------------------------------------------------------


def split_block(c, pieces=3):
    block = bytes(c.headers_block(c.request_headers(extra=[("x-long", "v" * 60)])))
    step = max(1, len(block) // pieces)
    return [block[i : i + step] for i in range(0, len(block), step)]


@check("6.10/1", "Sends multiple CONTINUATION frames preceded by a HEADERS frame")
def continuation_ok(ctx):
    c = ctx.conn()
    parts = split_block(c)
    frames = [frame(HEADERS, END_STREAM, 1, parts[0])]
    frames += [frame(CONTINUATION, 0, 1, p) for p in parts[1:-1]]
    frames.append(frame(CONTINUATION, END_HEADERS, 1, parts[-1]))
    c.send(*frames)
    r = c.response(1)
    if r.status != 200:
        raise Failed("expected :status 200, saw %s" % r.headers)


@check("6.10/2", "Sends a CONTINUATION frame followed by any frame other than CONTINUATION")
def continuation_then_data(ctx):
    c = ctx.conn()
    parts = split_block(c)
    c.send(frame(HEADERS, 0, 1, parts[0]), frame(CONTINUATION, 0, 1, parts[1]), frame(DATA, END_STREAM, 1, b"x"))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.10/3", "Sends a CONTINUATION frame with 0x0 stream identifier")
def continuation_stream_zero(ctx):
    c = ctx.conn()
    parts = split_block(c, 2)
    c.send(frame(HEADERS, END_STREAM, 1, parts[0]), frame(CONTINUATION, END_HEADERS, 0, b"".join(parts[1:])))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.10/4", "Sends a CONTINUATION frame preceded by a HEADERS frame with END_HEADERS flag")
def continuation_after_end(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(c.get(1, "/big.bin"), frame(CONTINUATION, END_HEADERS, 1, bytes(c.headers_block([("x-a", "b")]))))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.10/5", "Sends a CONTINUATION frame preceded by a CONTINUATION frame with END_HEADERS flag")
def continuation_after_continuation_end(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    parts = split_block(c, 2)
    c.send(
        frame(HEADERS, END_STREAM, 1, parts[0]),
        frame(CONTINUATION, END_HEADERS, 1, b"".join(parts[1:])),
        frame(CONTINUATION, END_HEADERS, 1, bytes(c.headers_block([("x-a", "b")]))),
    )
    c.expect_connection_error(PROTOCOL_ERROR)


@check("6.10/6", "Sends a CONTINUATION frame preceded by a DATA frame")
def continuation_after_data(ctx):
    c = ctx.conn()
    c.send(post(c), frame(DATA, 0, 1, b"x"), frame(CONTINUATION, END_HEADERS, 1, bytes(c.headers_block([("x-a", "b")]))))
    c.expect_connection_error(PROTOCOL_ERROR)


# -- 7 Error Codes -------------------------------------------------------------------


@check("7/1", "Sends a GOAWAY frame with unknown error code")
def goaway_unknown_code(ctx):
    # An unknown code triggers nothing special (§7): the PING is answered, or the
    # server closes gracefully as after any GOAWAY with no stream open (h2spec:
    # PING or close); an error of its own would be special behaviour.
    c = ctx.conn()
    c.send(goaway(code=0xFF), ping(b"unknown!"))
    try:
        f = c.wait_for(
            lambda f: isinstance(f, GoAwayFrame) or (isinstance(f, PingFrame) and "ACK" in f.flags),
            "PING ACK, or a graceful close",
        )
    except Failed:
        if c.closed:
            return
        raise
    if isinstance(f, GoAwayFrame) and f.error_code != NO_ERROR:
        raise Failed("expected PING ACK or a graceful close after GOAWAY(0xff), saw %s" % describe(f))


@check("7/2", "Sends a RST_STREAM frame with unknown error code")
def rst_unknown_code(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.send(c.get(1, "/big.bin"), rst(1, 0xFF))
    c.expect_alive()
    c.send(settings((INITIAL_WINDOW_SIZE, 65535)), c.get(3))
    if c.response(3).status != 200:
        raise Failed("expected stream 3 served after RST_STREAM(0xff) on 1")
