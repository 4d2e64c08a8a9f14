"""A real client: httpx with HTTP/2, over h2c (prior knowledge) and over TLS with
ALPN h2: static files and the proxy (GET, POST with a length and without), each
response over HTTP/2 with the right bytes."""

import os
import ssl

import httpx

from h2conf import *  # noqa: F401,F403
from h2conf import check


def exercise(ctx, client):
    def over_h2(r, what):
        if r.http_version != "HTTP/2":
            raise Failed("%s: expected the response over HTTP/2, saw %s" % (what, r.http_version))
        if r.status_code != 200:
            raise Failed("%s: expected 200, saw %d" % (what, r.status_code))
        return r

    for name in ("index.html", "big.bin"):
        r = over_h2(client.get("/" + name), "GET /" + name)
        if r.content != ctx.file(name):
            raise Failed("GET /%s: expected the file's %d octets, saw %d" % (name, len(ctx.file(name)), len(r.content)))
    r = over_h2(client.get("/echo/get?x=1", headers={"x-test": "h2"}), "GET /echo/get (proxied)")
    head = r.content.split(b"\r\n\r\n", 1)[0].decode(errors="replace").lower()
    if not head.startswith("get /echo/get?x=1 http/1.1") or "x-test: h2" not in head:
        raise Failed("GET through the proxy: expected the upstream to read the request, saw %r" % head[:300])
    body = os.urandom(200_000)
    r = over_h2(client.post("/echo/post", content=body), "POST /echo/post (proxied)")
    if r.content.split(b"\r\n\r\n", 1)[-1] != body:
        raise Failed("POST with a length: expected the %d octets echoed, saw %d" % (len(body), len(r.content)))
    pieces = [os.urandom(20_000) for _ in range(5)]
    r = over_h2(client.post("/echo/stream", content=iter(pieces)), "POST /echo/stream without a length (proxied)")
    if r.content.split(b"\r\n\r\n", 1)[-1] != b"".join(pieces):
        raise Failed("POST without a length: expected the 100000 octets echoed, saw %d" % len(r.content))


@check("httpx/1", "httpx (http2=True) over h2c prior knowledge: static files, GET and POST through a Proxy route")
def httpx_h2c(ctx):
    with httpx.Client(http1=False, http2=True, base_url="http://127.0.0.1:%d" % ctx.port, timeout=4 * WAIT) as c:
        exercise(ctx, c)


@check("httpx/2", "httpx (http2=True) over TLS with ALPN h2: static files, GET and POST through a Proxy route")
def httpx_tls(ctx):
    port = int(os.environ["H2_TLS_PORT"])
    tls = ssl.create_default_context(cafile=ctx.ca)
    with httpx.Client(http2=True, verify=tls, base_url="https://127.0.0.1:%d" % port, timeout=4 * WAIT) as c:
        exercise(ctx, c)
