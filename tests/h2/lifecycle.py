"""A connection's lifecycle: a client that never opens its window is closed after
the server's `send_timeout` (zero-window stall); `-s quit` with a stream open sends
the two-step GOAWAY (2^31-1, then the last stream id) and the stream completes.

`quit` stops the daemon: run it last, alone."""

import subprocess
import time

from h2conf import *  # noqa: F401,F403
from h2conf import check, describe, settings, window_update

# A bound for what a short send_timeout takes on a loaded machine: generous, and
# never compared with the time it took.
CLOSE_BOUND = 60


@check("life/1", "Zero-window stall: SETTINGS_INITIAL_WINDOW_SIZE 0, a large file, no WINDOW_UPDATE: closed after send_timeout")
def zero_window_stall(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.auto_window = False
    c.send(c.get(1, "/big.bin"))
    c.wait_for(lambda f: isinstance(f, HeadersFrame) and f.stream_id == 1, "the response HEADERS on 1")
    deadline = time.monotonic() + CLOSE_BOUND
    while True:
        try:
            f = c.next_frame(deadline)
        except Closed:
            return
        if f is None:
            raise Failed("expected the stalled connection closed, still open after %ds: %s" % (CLOSE_BOUND, c.trace()))
        if isinstance(f, DataFrame) and f.flow_controlled_length:
            raise Failed("expected no DATA into a window of 0, saw %s" % describe(f))


@check("life/2", "-s quit with a stream open: GOAWAY(2^31-1), then GOAWAY(last stream), the stream completes")
def quit_two_step(ctx):
    c = ctx.conn(*[(INITIAL_WINDOW_SIZE, 0)])
    c.auto_window = False
    c.send(c.get(1, "/big.bin"))
    c.wait_for(lambda f: isinstance(f, HeadersFrame) and f.stream_id == 1, "the response HEADERS on 1")
    out = subprocess.run([ctx.bin, "-c", ctx.config, "-s", "quit"], capture_output=True, timeout=30)
    if out.returncode != 0:
        raise Failed("forkd -s quit failed: %s" % out.stderr.decode(errors="replace"))
    first = c.wait_for(lambda f: isinstance(f, GoAwayFrame), "GOAWAY(NO_ERROR, last 2^31-1)", timeout=20)
    if first.error_code != NO_ERROR or first.last_stream_id != 2**31 - 1:
        raise Failed("expected a first GOAWAY(NO_ERROR, last 2147483647), saw %s" % describe(first))
    # The PING that follows it is answered by the reader; then the real last id.
    second = c.wait_for(lambda f: isinstance(f, GoAwayFrame), "GOAWAY(NO_ERROR, last 1)", timeout=20)
    if second.error_code != NO_ERROR or second.last_stream_id != 1:
        raise Failed("expected a second GOAWAY(NO_ERROR, last 1), saw %s" % describe(second))
    # The whole window at once, then nothing more from us: the stream's bytes
    # flow to the end without another client write.
    c.send(settings((INITIAL_WINDOW_SIZE, 2**31 - 1)), window_update(0, 2**31 - 1 - 65535))
    r = c.response(1, timeout=4 * WAIT)
    if bytes(r.data) != ctx.file("big.bin"):
        raise Failed("expected stream 1 complete after GOAWAY, saw %d of %d octets" % (len(r.data), len(ctx.file("big.bin"))))
