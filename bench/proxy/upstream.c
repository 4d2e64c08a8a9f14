/*
 * bench/proxy/upstream.c: the canned upstream for the proxy benchmark.
 *
 * One thread, epoll, non-blocking sockets, keep-alive: every request (a head ending
 * in CRLF CRLF; request bodies are not expected) is answered with the same 200 and a
 * 1 KiB body. Pipelined requests in one read are answered in one write. It does no
 * parsing beyond finding the end of each head and a `Connection: close`, so the
 * proxy under test, not this, is where the CPU goes.
 *
 *   cc -O2 -o upstream upstream.c && ./upstream PORT [IDLE_MS]
 *
 * With IDLE_MS, a connection idle that long is closed (within 10 ms), as application
 * servers do: the stale-connection race a proxy's pool must survive (RFC 9112 §9.5).
 * Prints "ready" on stdout once listening.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../lib/loopback.h"

#define BODY 1024
#define MAX_EVENTS 256
#define BUF 16384
#define MAX_FD 65536

static char response[256 + BODY];
static size_t response_len;

struct conn {
    int fd;
    long long last_ms; /* last read, for IDLE_MS */
    size_t have;       /* bytes of a partial head kept from the last read */
    char buf[BUF];
};

static struct conn *conns[MAX_FD];
static int max_fd;

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void close_conn(struct conn *c) {
    conns[c->fd] = NULL;
    close(c->fd); /* also removes it from the epoll set */
    free(c);
}

/* Answers every complete head in c->buf; returns -1 to close the connection. */
static int serve(struct conn *c) {
    char out[8 * sizeof(response)];
    size_t out_len = 0, start = 0;
    int close_after = 0;
    for (;;) {
        char *end = memmem(c->buf + start, c->have - start, "\r\n\r\n", 4);
        if (!end)
            break;
        size_t head_len = (size_t)(end - (c->buf + start)) + 4;
        if (memmem(c->buf + start, head_len, "onnection: close", 16) ||
            memmem(c->buf + start, head_len, "onnection: Close", 16))
            close_after = 1;
        if (out_len + response_len > sizeof(out)) {
            if (write(c->fd, out, out_len) != (ssize_t)out_len)
                return -1;
            out_len = 0;
        }
        memcpy(out + out_len, response, response_len);
        out_len += response_len;
        start += head_len;
        if (close_after)
            break;
    }
    memmove(c->buf, c->buf + start, c->have - start);
    c->have -= start;
    /* Loopback and a small response: a short write does not happen in practice;
       treat it as an error rather than buffer. */
    if (out_len && write(c->fd, out, out_len) != (ssize_t)out_len)
        return -1;
    if (close_after || c->have == sizeof(c->buf))
        return -1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s PORT [IDLE_MS]\n", argv[0]);
        return 2;
    }
    long long idle_ms = argc == 3 ? atoll(argv[2]) : 0;
    long long next_sweep = 0;
    char body[BODY];
    for (int i = 0; i < BODY; i++)
        body[i] = (char)(i & 0xff);
    response_len = (size_t)snprintf(response, sizeof(response),
                                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                                    "Content-Length: %d\r\n\r\n",
                                    BODY);
    memcpy(response + response_len, body, BODY);
    response_len += BODY;

    int ls = loopback_listener(argv[1]);
    int ep = epoll_create1(0);
    if (ep < 0)
        die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev) < 0)
        die("epoll_ctl");
    printf("ready\n");
    fflush(stdout);

    struct epoll_event events[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(ep, events, MAX_EVENTS, idle_ms ? 10 : -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            if (!c) {
                for (;;) {
                    int fd = accept_nodelay(ls, MAX_FD);
                    if (fd < 0)
                        break;
                    struct conn *nc = malloc(sizeof(*nc));
                    if (!nc)
                        die("malloc");
                    nc->fd = fd;
                    nc->have = 0;
                    nc->last_ms = now_ms();
                    conns[fd] = nc;
                    if (fd > max_fd)
                        max_fd = fd;
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = nc};
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev) < 0)
                        die("epoll_ctl");
                }
                continue;
            }
            ssize_t got = read(c->fd, c->buf + c->have, sizeof(c->buf) - c->have);
            if (got < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (idle_ms)
                c->last_ms = now_ms();
            if (got <= 0 || (c->have += (size_t)got, serve(c) < 0))
                close_conn(c);
        }
        /* After the batch, so no event of it points at a connection closed here. */
        if (idle_ms) {
            long long now = now_ms();
            if (now >= next_sweep) {
                next_sweep = now + 10;
                for (int fd = 0; fd <= max_fd; fd++)
                    if (conns[fd] && conns[fd]->have == 0 && now - conns[fd]->last_ms >= idle_ms)
                        close_conn(conns[fd]);
            }
        }
    }
}
