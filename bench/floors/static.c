/*
 * bench/floors/static.c: the static-file floor, the least an HTTP/1.1 server could do
 * per request for a small file on this kernel (forkd issue #23). bench/run measures it
 * beside forkd and nginx serving the same 1 KiB file, pinned to the same CPU.
 *
 *   cc -O2 -Wall -Wextra -o static static.c && ./static PORT KEEPALIVE_RESPONSE CLOSE_RESPONSE
 *
 * KEEPALIVE_RESPONSE and CLOSE_RESPONSE are files holding a whole response, head and
 * body: bench/run captures them from forkd itself (its answer to a keep-alive request
 * and to a `Connection: close` request for the 1 KiB file), so the floor writes the
 * very bytes forkd writes, and the kernel's share of the two is the same work.
 *
 * One thread, epoll, non-blocking sockets, the listener with TCP_DEFER_ACCEPT and
 * TCP_NODELAY (accepted sockets inherit it), as forkd's. A connection is registered
 * once, edge-triggered for reading and writing (as forkd's, through mio), and only if
 * its first request was not there when it was accepted; a read shorter than the
 * buffer has drained the socket (the next bytes to arrive are a new edge). Per request:
 *
 *   keep-alive:  read, write (2 calls; epoll_wait amortised over many events)
 *   close:       accept, read, write, close (4 calls; no epoll_ctl unless the request
 *                was not there yet when the connection was accepted)
 *
 * The only parsing is finding where each head ends (CRLF CRLF) and whether it asks for
 * `Connection: close` (a case-insensitive search in the head). Pipelined requests read
 * together are answered with one writev of as many canned responses. Request bodies
 * are not expected (wrk and h2load send none); a head that does not fit the buffer
 * closes the connection. Short writes and EAGAIN are handled (the rest waits for
 * EPOLLOUT). Prints "ready" on stdout once listening.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../lib/loopback.h"

#define MAX_EVENTS 256
#define MAX_FD 65536
#define BUF 8192
/* Responses of one writev at most (pipelined requests of one read). */
#define MAX_IOV 64

struct response {
    char *bytes;
    size_t len;
};

static struct response keepalive, closing;

struct conn {
    int fd;
    int registered;  /* in the epoll set */
    int close_after; /* the last request queued asked for Connection: close */
    size_t have;     /* bytes of a partial head kept from the last read */
    unsigned queued; /* responses not yet written, the first one from `sent` on */
    size_t sent;
    char buf[BUF];
};

static int ep;
/* Connections closed during a batch of events (a later event of the batch may still
 * point at one: it sees fd -1), then spare ones, reused by the next accepts (no malloc
 * per connection). */
static struct conn *dead[MAX_FD], *spare[MAX_FD];
static int deads, spares;

static void load(const char *path, struct response *r) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        die(path);
    r->len = (size_t)st.st_size;
    r->bytes = malloc(r->len);
    if (!r->bytes)
        die("malloc");
    size_t got = 0;
    while (got < r->len) {
        ssize_t n = read(fd, r->bytes + got, r->len - got);
        if (n <= 0)
            die(path);
        got += (size_t)n;
    }
    close(fd);
}

/* Once per connection, and only for one that has to wait. */
static void watch(struct conn *c) {
    if (c->registered)
        return;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.ptr = c};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) < 0)
        die("epoll_ctl");
    c->registered = 1;
}

static void close_conn(struct conn *c) {
    close(c->fd); /* also removes it from the epoll set */
    c->fd = -1;
    dead[deads++] = c;
}

/* The canned response for the n-th of the queued ones (the last may be the close one). */
static const struct response *nth(const struct conn *c, unsigned i) {
    return (i + 1 == c->queued && c->close_after) ? &closing : &keepalive;
}

/* Writes the queued responses; 1 when all are written, 0 when some wait for EPOLLOUT,
 * -1 on error. */
static int flush(struct conn *c) {
    while (c->queued) {
        struct iovec iov[MAX_IOV];
        unsigned n = c->queued < MAX_IOV ? c->queued : MAX_IOV;
        for (unsigned i = 0; i < n; i++) {
            const struct response *r = nth(c, i);
            iov[i] = (struct iovec){.iov_base = r->bytes, .iov_len = r->len};
        }
        iov[0].iov_base = (char *)iov[0].iov_base + c->sent;
        iov[0].iov_len -= c->sent;
        ssize_t w = n == 1 ? send(c->fd, iov[0].iov_base, iov[0].iov_len, 0) : writev(c->fd, iov, (int)n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                return -1;
            watch(c); /* the rest goes on the next EPOLLOUT edge */
            return 0;
        }
        size_t left = (size_t)w;
        while (c->queued && left >= nth(c, 0)->len - c->sent) {
            left -= nth(c, 0)->len - c->sent;
            c->sent = 0;
            c->queued--;
        }
        c->sent += left;
    }
    return 1;
}

/* Whether the head [p, p+n) has a `Connection: close` field (case-insensitive). */
static int asks_close(const char *p, size_t n) {
    static const char field[] = "\nconnection: close";
    const size_t len = sizeof(field) - 1;
    for (const char *end = p + n; (size_t)(end - p) >= len; p++) {
        p = memchr(p, '\n', (size_t)(end - p) - len + 1);
        if (!p)
            return 0;
        if (strncasecmp(p, field, len) == 0)
            return 1;
    }
    return 0;
}

/* Finds the complete heads in buf[0..len) (the ones before `have` were looked at
 * already): queues a response for each, keeps a partial one. 0, or -1 when a head does
 * not fit the buffer. */
static int heads(struct conn *c, size_t len) {
    /* A head's end may straddle the previous read: search from 3 bytes before. */
    size_t from = c->have > 3 ? c->have - 3 : 0, start = 0;
    for (;;) {
        char *end = memmem(c->buf + from, len - from, "\r\n\r\n", 4);
        if (!end)
            break;
        size_t head_end = (size_t)(end + 4 - c->buf);
        c->queued++;
        if (asks_close(c->buf + start, head_end - start)) {
            c->close_after = 1;
            start = len; /* anything after a close request is not answered */
            break;
        }
        start = from = head_end;
    }
    if (start == 0 && len == sizeof(c->buf))
        return -1;
    memmove(c->buf, c->buf + start, len - start);
    c->have = len - start;
    return 0;
}

/* Reads until a short read (edge-triggered: the socket is drained), answers. */
static void readable(struct conn *c) {
    for (;;) {
        if (c->close_after) /* a close response is still being written: read no more */
            return;
        size_t room = sizeof(c->buf) - c->have;
        ssize_t n = recv(c->fd, c->buf + c->have, room, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            watch(c);
            return;
        }
        if (n <= 0 || heads(c, c->have + (size_t)n) < 0) {
            close_conn(c);
            return;
        }
        if (c->queued) {
            int r = flush(c);
            if (r < 0 || (r > 0 && c->close_after)) {
                close_conn(c);
                return;
            }
        }
        if ((size_t)n < room) {
            watch(c); /* no-op once registered */
            return;
        }
    }
}

static void accept_all(int ls) {
    for (;;) {
        /* TCP_NODELAY is inherited from the listener (Linux). */
        int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
        if (fd < 0)
            return;
        if (fd >= MAX_FD) {
            close(fd);
            continue;
        }
        struct conn *c = spares ? spare[--spares] : malloc(sizeof(*c));
        if (!c)
            die("malloc");
        c->fd = fd;
        c->registered = c->close_after = 0;
        c->have = c->sent = 0;
        c->queued = 0;
        /* TCP_DEFER_ACCEPT: the request is there already; registered only if not. */
        readable(c);
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s PORT KEEPALIVE_RESPONSE CLOSE_RESPONSE\n", argv[0]);
        return 2;
    }
    load(argv[2], &keepalive);
    load(argv[3], &closing);
    int ls = floor_listener(argv[1]);
    static struct conn listener; /* its fd is the listener's: tells events apart */
    listener.fd = ls;
    ep = epoll_with_listener(ls, &listener);

    struct epoll_event events[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(ep, events, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            if (c == &listener) {
                accept_all(ls);
                continue;
            }
            if (c->fd < 0) /* closed earlier in this batch */
                continue;
            uint32_t ev = events[i].events;
            if ((ev & EPOLLOUT) && c->queued) {
                int r = flush(c);
                if (r < 0 || (r > 0 && c->close_after)) {
                    close_conn(c);
                    continue;
                }
            }
            if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR))
                readable(c);
        }
        while (deads)
            spare[spares++] = dead[--deads];
    }
}
