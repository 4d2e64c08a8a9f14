// bench/websocket/ws.c — the two ends of the WebSocket tunnel benchmark, one epoll
// thread each:
//
//   ws upstream PORT                      answers any request head with a 101
//                                         (Upgrade: websocket), then echoes every byte
//   ws client PORT CONNS SECONDS SIZE     CONNS connections through the proxy, each
//                                         sending one SIZE-byte masked binary frame and
//                                         waiting for its echo, again and again, for
//                                         SECONDS; prints round trips and errors
//
// The proxies under test tunnel bytes after the 101 and do not parse frames, so the
// upstream echoes the client's frame as is. Build: cc -O2 -o ws ws.c
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUF (64 * 1024)

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void nonblock(int fd) {
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) die("fcntl");
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

// ---- upstream ---------------------------------------------------------------------

struct up {
    int fd;
    int upgraded;
    char buf[BUF];
    size_t len;  // bytes in buf (the head so far, or echo bytes not written yet)
    size_t at;   // echo bytes written
};

static const char SWITCH[] =
    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";

// Moves what it can; returns -1 when the connection is finished.
static int up_io(struct up *c) {
    for (;;) {
        if (c->upgraded && c->at < c->len) {
            ssize_t n = write(c->fd, c->buf + c->at, c->len - c->at);
            if (n < 0) return errno == EAGAIN ? 0 : -1;
            c->at += n;
            if (c->at < c->len) continue;
            c->at = c->len = 0;
        }
        ssize_t n = read(c->fd, c->buf + c->len, BUF - c->len);
        if (n == 0) return -1;
        if (n < 0) return errno == EAGAIN ? 0 : -1;
        c->len += n;
        if (!c->upgraded) {
            if (!memmem(c->buf, c->len, "\r\n\r\n", 4)) {
                if (c->len == BUF) return -1;
                continue;
            }
            // Nothing follows the head before the 101: clients wait for it.
            if (write(c->fd, SWITCH, sizeof SWITCH - 1) != (ssize_t)(sizeof SWITCH - 1)) return -1;
            c->upgraded = 1;
            c->len = c->at = 0;
        }
    }
}

static _Noreturn void run_upstream(int port) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    if (listen(l, 1024) < 0) die("listen");
    nonblock(l);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
    printf("ready\n");
    fflush(stdout);
    struct epoll_event evs[256];
    for (;;) {
        int n = epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < n; i++) {
            struct up *c = evs[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(l, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    c = calloc(1, sizeof *c);
                    c->fd = fd;
                    struct epoll_event e = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
                }
                continue;
            }
            if (up_io(c) < 0) {
                close(c->fd);
                free(c);
            }
        }
    }
}

// ---- client -----------------------------------------------------------------------

struct cl {
    int fd;
    size_t sent, got;  // of the current frame and its echo
};

static int run_client(int port, int conns, double seconds, size_t size) {
    static const char REQ[] =
        "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    // One masked binary frame of `size` bytes in all (header, mask, payload).
    size_t hdr = size <= 131 ? 6 : 8;
    if (size < 16 || size > 65535) {
        fprintf(stderr, "SIZE must be 16..65535\n");
        return 2;
    }
    unsigned char *frame = malloc(size), *echo = malloc(size);
    size_t payload = size - hdr;
    frame[0] = 0x82;
    if (hdr == 6) {
        frame[1] = 0x80 | payload;
    } else {
        frame[1] = 0x80 | 126;
        frame[2] = payload >> 8;
        frame[3] = payload & 0xff;
    }
    memcpy(frame + hdr - 4, "\x12\x34\x56\x78", 4);
    for (size_t i = hdr; i < size; i++) frame[i] = (unsigned char)(i * 31);

    struct cl *c = calloc(conns, sizeof *c);
    int ep = epoll_create1(0), one = 1;
    for (int i = 0; i < conns; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (write(fd, REQ, sizeof REQ - 1) != (ssize_t)(sizeof REQ - 1)) die("write");
        char head[4096];
        size_t len = 0;
        while (!memmem(head, len, "\r\n\r\n", 4)) {
            ssize_t n = read(fd, head + len, sizeof head - len);
            if (n <= 0) die("read 101");
            len += n;
        }
        if (strncmp(head, "HTTP/1.1 101", 12) != 0) {
            fprintf(stderr, "no 101: %.*s\n", (int)len, head);
            return 1;
        }
        nonblock(fd);
        c[i].fd = fd;
        struct epoll_event e = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.ptr = &c[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
    }
    unsigned long long trips = 0, errors = 0;
    double end = now_s() + seconds;
    struct epoll_event evs[256];
    while (now_s() < end) {
        int n = epoll_wait(ep, evs, 256, 100);
        for (int i = 0; i < n; i++) {
            struct cl *k = evs[i].data.ptr;
            if (k->fd < 0) continue;
            for (;;) {
                if (k->sent < size) {
                    ssize_t w = write(k->fd, frame + k->sent, size - k->sent);
                    if (w < 0 && errno == EAGAIN) break;
                    if (w <= 0) goto fail;
                    k->sent += w;
                    continue;
                }
                ssize_t r = read(k->fd, echo + k->got, size - k->got);
                if (r < 0 && errno == EAGAIN) break;
                if (r <= 0) goto fail;
                k->got += r;
                if (k->got == size) {
                    if (memcmp(echo, frame, size) != 0) goto fail;
                    trips++;
                    k->sent = k->got = 0;
                }
                continue;
            fail:
                errors++;
                close(k->fd);
                k->fd = -1;
                break;
            }
        }
    }
    printf("round_trips %llu\nerrors %llu\nseconds %.3f\n", trips, errors, seconds);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "upstream") == 0) run_upstream(atoi(argv[2]));
    if (argc == 6 && strcmp(argv[1], "client") == 0)
        return run_client(atoi(argv[2]), atoi(argv[3]), atof(argv[4]), strtoul(argv[5], NULL, 10));
    fprintf(stderr, "usage: ws upstream PORT | ws client PORT CONNS SECONDS SIZE\n");
    return 2;
}
