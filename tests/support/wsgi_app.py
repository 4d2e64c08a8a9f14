"""A small plain-WSGI application (stdlib only) for gunicorn, the application server
that `tests/support/gunicorn.rs` and `bench/app-shield/run` put behind forkd.

Every response says what it is for, so a test or the bench can check the bytes:

  /tiny            5 bytes, "tiny\\n", with Content-Length
  /big?mb=N        N MiB (at most 4096) with Content-Length, written 64 KiB at a time;
                   block i is i as 8 big-endian bytes, then bytes j % 251 for
                   j in 8..65536 (so a block out of place or a shifted piece shows)
  /upload          reads the whole request body; answers "LEN CRC32\\n" (decimal
                   length, zlib.crc32 as 8 lowercase hex digits)
  /sse?n=3&ms=200  text/event-stream: n events "id: i\\ndata: event i\\n\\n", ms apart
  /stream?n=5&ms=200&accel=no
                   text/plain "chunk i\\n" n times, ms apart, without a length (chunked);
                   with accel=no it says "X-Accel-Buffering: no"
  /redirect        302 to http://APP_SELF/tiny, APP_SELF being the host:port gunicorn
                   listens on (from the environment), as an application that names
                   itself does
  /echo-headers    the request head as gunicorn got it: "METHOD RAW_URI PROTOCOL",
                   then one "Name: value" line per field (names rebuilt from WSGI's
                   HTTP_* keys: "X-Forwarded-For"), then an empty line
  anything else    404
"""

import os
import time
import zlib
from urllib.parse import parse_qs

BLOCK = 64 * 1024
MIB = 1024 * 1024
_FILL = bytes(j % 251 for j in range(BLOCK))
SELF = os.environ.get("APP_SELF", "")


def big_block(i):
    return i.to_bytes(8, "big") + _FILL[8:]


def _query(environ):
    return {k: v[-1] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}


def _int(q, name, default, top):
    try:
        return max(0, min(int(q.get(name, default)), top))
    except ValueError:
        return default


def _plain(start_response, status, body, extra=()):
    start_response(
        status,
        [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))] + list(extra),
    )
    return [body]


def tiny(environ, start_response):
    return _plain(start_response, "200 OK", b"tiny\n")


def big(environ, start_response):
    mb = _int(_query(environ), "mb", 1, 4096)
    start_response(
        "200 OK",
        [("Content-Type", "application/octet-stream"), ("Content-Length", str(mb * MIB))],
    )
    return (big_block(i) for i in range(mb * MIB // BLOCK))


def upload(environ, start_response):
    body = environ["wsgi.input"]
    length, crc = 0, 0
    while True:
        piece = body.read(BLOCK)
        if not piece:
            break
        length += len(piece)
        crc = zlib.crc32(piece, crc)
    return _plain(start_response, "200 OK", f"{length} {crc:08x}\n".encode())


def _paced(pieces, ms):
    for i, piece in enumerate(pieces):
        if i:
            time.sleep(ms / 1000)
        yield piece


def sse(environ, start_response):
    q = _query(environ)
    n, ms = _int(q, "n", 3, 1000), _int(q, "ms", 200, 60000)
    start_response(
        "200 OK", [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")]
    )
    return _paced((f"id: {i}\ndata: event {i}\n\n".encode() for i in range(n)), ms)


def stream(environ, start_response):
    q = _query(environ)
    n, ms = _int(q, "n", 5, 100000), _int(q, "ms", 200, 60000)
    headers = [("Content-Type", "text/plain")]
    if q.get("accel") == "no":
        headers.append(("X-Accel-Buffering", "no"))
    start_response("200 OK", headers)
    return _paced((f"chunk {i}\n".encode() for i in range(n)), ms)


def redirect(environ, start_response):
    return _plain(
        start_response, "302 Found", b"moved\n", [("Location", f"http://{SELF}/tiny")]
    )


def echo_headers(environ, start_response):
    lines = [f"{environ['REQUEST_METHOD']} {environ['RAW_URI']} {environ['SERVER_PROTOCOL']}"]
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            name = "-".join(part.capitalize() for part in key[5:].split("_"))
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            name = "-".join(part.capitalize() for part in key.split("_"))
        else:
            continue
        lines.append(f"{name}: {value}")
    return _plain(start_response, "200 OK", ("\r\n".join(lines) + "\r\n\r\n").encode())


ROUTES = {
    "/tiny": tiny,
    "/big": big,
    "/upload": upload,
    "/sse": sse,
    "/stream": stream,
    "/redirect": redirect,
    "/echo-headers": echo_headers,
}


def application(environ, start_response):
    handler = ROUTES.get(environ.get("PATH_INFO", ""))
    if handler is None:
        return _plain(start_response, "404 Not Found", b"not found\n")
    return handler(environ, start_response)
