#!/usr/bin/env python3
"""bench/overload/upstream.py: an upstream of fixed capacity.

Usage: upstream.py PORT [CAPACITY] [SERVICE_MS]

At most CAPACITY requests (default 8) are served at once, each taking SERVICE_MS
(default 10 ms): about CAPACITY * 1000 / SERVICE_MS requests per second (800). More
wait, first come first served, as in an application server's thread pool. One asyncio
(epoll) thread; HTTP/1.1 keep-alive; every request gets a 200 with a small body.
Prints "ready" once listening.
"""

import asyncio
import sys

BODY = b"ok\n"
RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
            + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


async def serve(reader, writer, slots, service_s):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            async with slots:
                await asyncio.sleep(service_s)
            writer.write(RESPONSE)
            await writer.drain()
            if b"connection: close" in head.lower():
                break
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main():
    port = int(sys.argv[1])
    capacity = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    service_s = (float(sys.argv[3]) if len(sys.argv) > 3 else 10.0) / 1000
    slots = asyncio.Semaphore(capacity)
    server = await asyncio.start_server(
        lambda r, w: serve(r, w, slots, service_s), "127.0.0.1", port, backlog=4096)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
