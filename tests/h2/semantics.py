"""RFC 9113 §8 (HTTP semantics: request rules, pseudo-header fields,
connection-specific fields, malformed requests, server push) and requests a user
makes: a static file byte-identical, a range, HEAD, 404, a POST with trailers."""

from h2conf import *  # noqa: F401,F403
from h2conf import check, frame


def malformed(ctx, headers, end_stream=True, extra_frames=()):
    """Sends `headers` on stream 1; the server must answer with a stream error
    PROTOCOL_ERROR (a 400-equivalent), and the connection keeps serving. The h2
    crate rejects some (invalid names and values, unknown pseudo-header fields)
    while decoding the block, as a connection error PROTOCOL_ERROR: RFC 9113 §5.4.1
    lets an endpoint treat a stream error as a connection error, h2spec accepts it;
    noted."""
    c = ctx.conn()
    c.send(c.headers(1, headers, end_stream=end_stream), *extra_frames)
    c.expect_stream_error(1, PROTOCOL_ERROR)
    if c.closed or any(s.startswith("GOAWAY") for s in c.seen):
        return c
    c.send(c.get(3))
    r = c.response(3)
    if r.status != 200:
        raise Failed("expected stream 3 served after the stream error, saw %s" % r.headers)
    return c


def base(path="/", method="GET"):
    return [(":method", method), (":scheme", "http"), (":path", path), (":authority", "localhost")]


# -- 8.1 HTTP Request/Response Exchange ----------------------------------------------


@check("8.1/1", "Sends a second HEADERS frame without the END_STREAM flag")
def second_headers_without_end_stream(ctx):
    c = ctx.conn()
    c.send(
        c.headers(1, base("/echo", "POST"), end_stream=False),
        frame(DATA, 0, 1, b"test"),
        c.headers(1, [("x-trailer", "yes")], end_stream=False),
    )
    c.expect_stream_error(1, PROTOCOL_ERROR)


@check("8.1/2", "Sends a POST with a body and trailers")
def post_with_trailers(ctx):
    c = ctx.conn()
    c.send(
        c.headers(1, base("/echo", "POST"), end_stream=False),
        frame(DATA, 0, 1, b"hello "),
        frame(DATA, 0, 1, b"world"),
        c.headers(1, [("x-trailer", "yes")], end_stream=True),
    )
    r = c.response(1)
    if r.status != 200 or r.echoed != b"hello world":
        raise Failed("expected 200 echoing b'hello world', saw %s %r" % (r.status, bytes(r.data)[:200]))


# -- 8.1.2 HTTP Header Fields --------------------------------------------------------


@check("8.1.2/1", "Sends a HEADERS frame that contains the header field name in uppercase letters")
def uppercase_name(ctx):
    malformed(ctx, base() + [("X-TEST", "ok")])


@check("8.1.2/2", "Sends a HEADERS frame with a field value containing CR/LF")
def value_with_newline(ctx):
    malformed(ctx, base() + [("x-test", "a\r\nx-injected: 1")])


# -- 8.1.2.1 Pseudo-Header Fields ----------------------------------------------------


@check("8.1.2.1/1", "Sends a HEADERS frame that contains a unknown pseudo-header field")
def unknown_pseudo(ctx):
    malformed(ctx, base() + [(":test", "ok")])


@check("8.1.2.1/2", "Sends a HEADERS frame that contains the pseudo-header field defined for response")
def response_pseudo(ctx):
    malformed(ctx, base() + [(":status", "200")])


@check("8.1.2.1/3", "Sends a HEADERS frame that contains a pseudo-header field as trailers")
def pseudo_in_trailers(ctx):
    c = ctx.conn()
    c.send(
        c.headers(1, base("/echo", "POST"), end_stream=False),
        frame(DATA, 0, 1, b"test"),
        c.headers(1, [(":method", "POST")], end_stream=True),
    )
    c.expect_stream_error(1, PROTOCOL_ERROR)


@check("8.1.2.1/4", "Sends a HEADERS frame that contains a pseudo-header field that appears in a header block after a regular header field")
def pseudo_after_regular(ctx):
    malformed(ctx, base()[:3] + [("x-test", "ok"), (":authority", "localhost")])


# -- 8.1.2.2 Connection-Specific Header Fields ---------------------------------------


@check("8.1.2.2/1", "Sends a HEADERS frame that contains the connection-specific header field")
def connection_field(ctx):
    malformed(ctx, base() + [("connection", "keep-alive")])


@check("8.1.2.2/2", 'Sends a HEADERS frame that contains the TE header field with any value other than "trailers"')
def te_not_trailers(ctx):
    malformed(ctx, base() + [("trailers", "test"), ("te", "trailers, deflate")])


@check("8.1.2.2/3", "Sends each of keep-alive, proxy-connection, transfer-encoding, upgrade")
def other_connection_fields(ctx):
    for name, value in [
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("transfer-encoding", "chunked"),
        ("upgrade", "websocket"),
    ]:
        try:
            malformed(ctx, base() + [(name, value)])
        except Failed as e:
            raise Failed("%s: %s" % (name, e))


@check("8.1.2.2/4", 'Sends TE: trailers (allowed)')
def te_trailers(ctx):
    c = ctx.conn()
    c.send(c.headers(1, base() + [("te", "trailers")]))
    r = c.response(1)
    if r.status != 200:
        raise Failed("expected :status 200, saw %s reset %s" % (r.headers, r.reset))


# -- 8.1.2.3 Request Pseudo-Header Fields --------------------------------------------


@check("8.1.2.3/1", 'Sends a HEADERS frame with empty ":path" pseudo-header field')
def empty_path(ctx):
    malformed(ctx, [(":method", "GET"), (":scheme", "http"), (":path", ""), (":authority", "localhost")])


@check("8.1.2.3/2", 'Sends a HEADERS frame that omits ":method" pseudo-header field')
def no_method(ctx):
    malformed(ctx, [h for h in base() if h[0] != ":method"])


@check("8.1.2.3/3", 'Sends a HEADERS frame that omits ":scheme" pseudo-header field')
def no_scheme(ctx):
    malformed(ctx, [h for h in base() if h[0] != ":scheme"])


@check("8.1.2.3/4", 'Sends a HEADERS frame that omits ":path" pseudo-header field')
def no_path(ctx):
    malformed(ctx, [h for h in base() if h[0] != ":path"])


@check("8.1.2.3/5", 'Sends a HEADERS frame with duplicated ":method" pseudo-header field')
def dup_method(ctx):
    malformed(ctx, base()[:1] + base())


@check("8.1.2.3/6", 'Sends a HEADERS frame with duplicated ":scheme" pseudo-header field')
def dup_scheme(ctx):
    malformed(ctx, base()[:2] + base()[1:])


@check("8.1.2.3/7", 'Sends a HEADERS frame with duplicated ":path" pseudo-header field')
def dup_path(ctx):
    malformed(ctx, base()[:3] + base()[2:])


@check("8.1.2.3/8", "Sends a CONNECT request without :authority, and OPTIONS * (both well-formed)")
def asterisk_options(ctx):
    c = ctx.conn()
    c.send(c.headers(1, [(":method", "OPTIONS"), (":scheme", "http"), (":path", "*"), (":authority", "localhost")]))
    r = c.response(1)
    if r.reset is not None:
        raise Failed("expected an answer to OPTIONS *, saw RST_STREAM(%s)" % code_name(r.reset))


# -- 8.1.2.6 Malformed Requests and Responses ----------------------------------------


@check("8.1.2.6/1", 'Sends a HEADERS frame with the "content-length" header field which does not equal the DATA frame payload length')
def content_length_mismatch(ctx):
    c = ctx.conn()
    c.send(
        c.headers(1, base("/echo", "POST") + [("content-length", "1")], end_stream=False),
        frame(DATA, END_STREAM, 1, b"test"),
    )
    c.expect_stream_error(1, PROTOCOL_ERROR)


@check("8.1.2.6/2", 'Sends a HEADERS frame with the "content-length" header field which does not equal the sum of the multiple DATA frames payload length')
def content_length_mismatch_multi(ctx):
    c = ctx.conn()
    c.send(
        c.headers(1, base("/echo", "POST") + [("content-length", "1")], end_stream=False),
        frame(DATA, 0, 1, b"test"),
        frame(DATA, END_STREAM, 1, b"test"),
    )
    c.expect_stream_error(1, PROTOCOL_ERROR)


@check("8.1.2.6/3", 'Sends "content-length" larger than the DATA sent before END_STREAM')
def content_length_short(ctx):
    c = ctx.conn()
    c.send(
        c.headers(1, base("/echo", "POST") + [("content-length", "100")], end_stream=False),
        frame(DATA, END_STREAM, 1, b"test"),
    )
    c.expect_stream_error(1, PROTOCOL_ERROR)


# -- 8.2 Server Push -----------------------------------------------------------------


@check("8.2/1", "Sends a PUSH_PROMISE frame")
def client_push(ctx):
    c = ctx.conn()
    block = bytes(c.headers_block(base()))
    c.send(frame(PUSH_PROMISE, END_HEADERS, 1, b"\x00\x00\x00\x02" + block))
    c.expect_connection_error(PROTOCOL_ERROR)


@check("8.2/2", "The server pushes nothing, though push is enabled by default")
def no_push(ctx):
    c = ctx.conn()
    c.send(c.get(1, "/index.html"))
    c.response(1)
    if any(s.startswith("PUSHPROMISE") for s in c.seen):
        raise Failed("expected no PUSH_PROMISE, saw %s" % c.trace())


# -- Requests a user makes -----------------------------------------------------------


@check("http/1", "GET a static file: byte-identical, content-length and content-type right")
def static_file(ctx):
    c = ctx.conn()
    c.send(c.get(1, "/big.bin"))
    r = c.response(1, timeout=4 * WAIT)
    want = ctx.file("big.bin")
    if r.status != 200 or bytes(r.data) != want:
        raise Failed("expected 200 with big.bin's %d octets, saw %s, %d octets" % (len(want), r.status, len(r.data)))
    if r.header("content-length") != str(len(want)):
        raise Failed("expected content-length %d, saw %s" % (len(want), r.header("content-length")))
    bad = [k for k, _ in r.headers if k in ("connection", "keep-alive", "transfer-encoding")]
    if bad:
        raise Failed("expected no connection-specific fields in the response, saw %s" % bad)


@check("http/2", "GET with Range: 206 with exactly the range")
def range_request(ctx):
    c = ctx.conn()
    c.send(c.get(1, "/big.bin", extra=[("range", "bytes=1000-1999")]))
    r = c.response(1)
    want = ctx.file("big.bin")[1000:2000]
    if r.status != 206 or bytes(r.data) != want:
        raise Failed("expected 206 with octets 1000-1999, saw %s, %d octets" % (r.status, len(r.data)))
    cr = r.header("content-range")
    if cr != "bytes 1000-1999/%d" % len(ctx.file("big.bin")):
        raise Failed("expected content-range bytes 1000-1999/..., saw %s" % cr)


@check("http/3", "HEAD: headers with the length, no DATA payload")
def head_request(ctx):
    c = ctx.conn()
    c.send(c.get(1, "/big.bin", method="HEAD"))
    r = c.response(1)
    if r.status != 200 or r.data:
        raise Failed("expected 200 with no body, saw %s, %d octets" % (r.status, len(r.data)))
    if r.header("content-length") != str(len(ctx.file("big.bin"))):
        raise Failed("expected content-length of big.bin, saw %s" % r.header("content-length"))


@check("http/4", "GET a missing file: 404, the connection keeps serving")
def not_found(ctx):
    c = ctx.conn()
    c.send(c.get(1, "/no-such-file"))
    r = c.response(1)
    if r.status != 404:
        raise Failed("expected :status 404, saw %s" % r.headers)
    c.send(c.get(3, "/index.html"))
    r = c.response(3)
    if r.status != 200 or bytes(r.data) != ctx.file("index.html"):
        raise Failed("expected index.html after the 404, saw %s %r" % (r.status, bytes(r.data)[:80]))


@check("http/5", "Many streams at once, each answered with its own file")
def many_streams(ctx):
    c = ctx.conn()
    c.send(*[c.get(2 * i + 1, "/index.html" if i % 2 else "/big.bin") for i in range(8)])
    for i in range(8):
        r = c.response(2 * i + 1, timeout=4 * WAIT)
        want = ctx.file("index.html" if i % 2 else "big.bin")
        if r.status != 200 or bytes(r.data) != want:
            raise Failed("stream %d: expected its file, saw %s, %d octets" % (2 * i + 1, r.status, len(r.data)))


@check("http/6", "Cookies in several fields reach the upstream joined")
def cookies_joined(ctx):
    c = ctx.conn()
    c.send(c.headers(1, base("/echo/cookies", "GET") + [("cookie", "a=1"), ("cookie", "b=2")]))
    r = c.response(1)
    # The echo upstream answers the request head it read.
    if b"a=1; b=2" not in bytes(r.data):
        raise Failed("expected the upstream to see 'cookie: a=1; b=2', saw %r" % bytes(r.data)[:300])
