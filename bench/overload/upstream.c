/*
 * bench/overload/upstream.c: an upstream of exact, fixed capacity.
 *
 *   cc -O2 -o upstream upstream.c && ./upstream PORT [CAPACITY] [SERVICE_MS]
 *
 * At most CAPACITY requests (default 8) are in service at once, each for SERVICE_MS
 * (default 10 ms) measured by its own timerfd; the others wait in one first-come
 * first-served queue, as in an application server's thread pool. So the capacity is
 * CAPACITY * 1000 / SERVICE_MS requests per second (800) less only the time from a
 * timer's expiry to the next request's start (microseconds), not a Python event
 * loop's scheduling. One thread, epoll, non-blocking sockets, HTTP/1.1 keep-alive
 * (requests of one connection are answered in order); every request (a head ending
 * in CRLF CRLF, no body) gets a 200 with a small body. A request whose connection
 * closed while it waited is dropped without taking a slot.
 *
 * Prints "ready" once listening; on SIGTERM or SIGINT prints "served N" and exits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "../lib/loopback.h"

#define MAX_EVENTS 256
#define BUF 8192
#define MAX_FD 65536
#define MAX_SLOTS 256
#define QUEUE (1 << 20) /* waiting requests; far more than a 3 s client timeout leaves */

static const char RESPONSE[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                               "Content-Length: 3\r\n\r\nok\n";

struct conn {
    int fd;
    unsigned gen;   /* tells a request of this connection from one of a reused fd */
    int closing;    /* `Connection: close` seen: close once its answers are out */
    unsigned owed;  /* requests read and not answered yet */
    size_t have;
    char buf[BUF];
};

/* A request: its connection's fd and generation. */
struct req {
    int fd;
    unsigned gen;
};

static struct conn *conns[MAX_FD];
static unsigned gens[MAX_FD];
static struct req queue[QUEUE];
static size_t q_head, q_len;
static int slot_tfd[MAX_SLOTS];
static struct req slot_req[MAX_SLOTS];
static int slot_busy[MAX_SLOTS];
static int capacity = 8;
static long service_ns = 10 * 1000 * 1000L;
static unsigned long long served;
static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static void close_conn(struct conn *c) {
    conns[c->fd] = NULL;
    gens[c->fd]++;
    close(c->fd);
    free(c);
}

static struct conn *live(struct req r) {
    struct conn *c = r.fd >= 0 && r.fd < MAX_FD ? conns[r.fd] : NULL;
    return c && c->gen == r.gen ? c : NULL;
}

/* Puts the next waiting request of a live connection into slot s, if any. */
static void start_next(int s) {
    while (q_len) {
        struct req r = queue[q_head];
        q_head = (q_head + 1) % QUEUE;
        q_len--;
        if (!live(r))
            continue;
        struct itimerspec t = {.it_value = {.tv_sec = service_ns / 1000000000L,
                                            .tv_nsec = service_ns % 1000000000L}};
        if (timerfd_settime(slot_tfd[s], 0, &t, NULL) < 0)
            die("timerfd_settime");
        slot_req[s] = r;
        slot_busy[s] = 1;
        return;
    }
    slot_busy[s] = 0;
}

static void enqueue(struct conn *c) {
    if (q_len == QUEUE) {
        fprintf(stderr, "upstream: queue full\n");
        exit(1);
    }
    queue[(q_head + q_len) % QUEUE] = (struct req){c->fd, c->gen};
    q_len++;
    c->owed++;
    for (int s = 0; s < capacity; s++)
        if (!slot_busy[s]) {
            start_next(s);
            return;
        }
}

/* Queues every complete head in c->buf; -1: the connection is to be closed. */
static int read_heads(struct conn *c) {
    size_t start = 0;
    for (;;) {
        if (c->closing)
            break; /* nothing after `Connection: close` is served */
        char *end = memmem(c->buf + start, c->have - start, "\r\n\r\n", 4);
        if (!end)
            break;
        size_t head_len = (size_t)(end - (c->buf + start)) + 4;
        if (memmem(c->buf + start, head_len, "onnection: close", 16) ||
            memmem(c->buf + start, head_len, "onnection: Close", 16))
            c->closing = 1;
        enqueue(c);
        start += head_len;
    }
    memmove(c->buf, c->buf + start, c->have - start);
    c->have -= start;
    return c->have == sizeof(c->buf) ? -1 : 0;
}

/* Slot s's time is up: its request is answered and the next one starts. */
static void finish(int s) {
    uint64_t expirations;
    if (read(slot_tfd[s], &expirations, sizeof(expirations)) < 0)
        return; /* EAGAIN: re-armed meanwhile */
    if (!slot_busy[s])
        return;
    struct conn *c = live(slot_req[s]);
    start_next(s);
    if (!c)
        return;
    served++;
    c->owed--;
    /* Loopback and a tiny response: a short write does not happen in practice. */
    if (write(c->fd, RESPONSE, sizeof(RESPONSE) - 1) != (ssize_t)(sizeof(RESPONSE) - 1) ||
        (c->closing && c->owed == 0))
        close_conn(c);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: %s PORT [CAPACITY] [SERVICE_MS]\n", argv[0]);
        return 2;
    }
    if (argc > 2)
        capacity = atoi(argv[2]);
    if (argc > 3)
        service_ns = (long)(atof(argv[3]) * 1e6);
    if (capacity < 1 || capacity > MAX_SLOTS || service_ns < 1) {
        fprintf(stderr, "capacity 1..%d, service time > 0\n", MAX_SLOTS);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    int ls = loopback_listener(argv[1]);
    int ep = epoll_create1(0);
    if (ep < 0)
        die("epoll_create1");
    /* data.u64: 0 the listener, 1..MAX_SLOTS a slot's timer + 1, else fd + 1 + MAX_SLOTS. */
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev) < 0)
        die("epoll_ctl");
    for (int s = 0; s < capacity; s++) {
        slot_tfd[s] = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
        if (slot_tfd[s] < 0)
            die("timerfd_create");
        struct epoll_event tev = {.events = EPOLLIN, .data.u64 = (uint64_t)s + 1};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, slot_tfd[s], &tev) < 0)
            die("epoll_ctl");
    }
    printf("ready\n");
    fflush(stdout);

    struct epoll_event events[MAX_EVENTS];
    while (!stop) {
        int n = epoll_wait(ep, events, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        /* Timers first: a slot freed in this batch takes the next request now. */
        for (int i = 0; i < n; i++) {
            uint64_t k = events[i].data.u64;
            if (k >= 1 && k <= MAX_SLOTS)
                finish((int)k - 1);
        }
        for (int i = 0; i < n; i++) {
            uint64_t k = events[i].data.u64;
            if (k == 0) {
                for (;;) {
                    int fd = accept_nodelay(ls, MAX_FD);
                    if (fd < 0)
                        break;
                    struct conn *c = calloc(1, sizeof(*c));
                    if (!c)
                        die("calloc");
                    c->fd = fd;
                    c->gen = gens[fd];
                    conns[fd] = c;
                    struct epoll_event cev = {.events = EPOLLIN,
                                              .data.u64 = (uint64_t)fd + 1 + MAX_SLOTS};
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev) < 0)
                        die("epoll_ctl");
                }
                continue;
            }
            if (k <= MAX_SLOTS)
                continue;
            int fd = (int)(k - 1 - MAX_SLOTS);
            struct conn *c = conns[fd];
            if (!c)
                continue; /* closed earlier in this batch */
            ssize_t got = read(fd, c->buf + c->have, sizeof(c->buf) - c->have);
            if (got < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (got <= 0 || (c->have += (size_t)got, read_heads(c) < 0))
                close_conn(c);
        }
    }
    printf("served %llu\n", served);
    return 0;
}
