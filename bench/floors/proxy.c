/*
 * bench/floors/proxy.c: the proxy floor, the least a reverse proxy could do per
 * request on this kernel (forkd issue #23). bench/proxy/run measures it beside forkd,
 * nginx and HAProxy, in front of the same canned upstream, pinned to the same CPU.
 *
 *   cc -O2 -Wall -Wextra -o floor proxy.c && ./floor PORT UPSTREAM_PORT
 *
 * One thread, epoll, non-blocking sockets; the listener has TCP_DEFER_ACCEPT and
 * TCP_NODELAY, as forkd's (accepted sockets inherit TCP_NODELAY). Every connection is
 * registered once, edge-triggered for reading and writing (as forkd's, through mio): a
 * client only once it has to wait (its request was not there when it was accepted, or
 * it is kept alive after its first response), an upstream connection when it is made.
 * Each client connection
 * takes one upstream connection from a pool (connecting a new one only when the pool
 * is empty) and holds it until the client closes, so with client keep-alive the pair
 * is connected once and kept, and with `Connection: close` upstream connections are
 * reused across client connections, as a pooling proxy does. Per request, then:
 *
 *   keep-alive:  read client, write upstream, read upstream, write client (4 calls)
 *   close:       accept, read client, write upstream, read upstream, write client,
 *                close (6 calls; no connect, no epoll_ctl unless the request was not
 *                there yet when the connection was accepted: with TCP_DEFER_ACCEPT it
 *                is accepted only once its request has come)
 *
 * Bytes are forwarded without parsing, with two exceptions that any proxy must make
 * for `Connection: close` and that keep the comparison with pooling proxies fair: a
 * request's `Connection: close` line is removed (it is hop-by-hop; forwarded, the
 * upstream would close the pooled connection), and the response then gets a
 * `Connection: close` line after its status line and the client is closed once it has
 * been written (otherwise wrk would send its next request on a connection the floor
 * is about to close). Finding these is one memmem over the request head and one
 * memchr over the status line.
 *
 * Assumption (what makes it a floor and not a proxy): a request arrives in one read
 * and its response in one read, and nothing is pipelined. wrk's requests (~60 bytes)
 * and the canned upstream's responses (one write of ~1.1 KiB over loopback) do, so the
 * floor never looks for where a message ends: the bytes of one upstream read are the
 * response. A peer that broke this would show up as wrk errors or non-2xx in the run,
 * which bench/proxy/run reports. Edge-triggered, a read shorter than the buffer's room
 * has drained the socket (the next bytes to arrive are a new edge); a read that fills
 * the buffer breaks the assumption and closes the pair. Short writes and EAGAIN are
 * handled (the rest is kept and written on the next EPOLLOUT edge).
 * Prints "ready" on stdout once listening.
 */
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
#include <unistd.h>

#include "../lib/loopback.h"

#define MAX_EVENTS 256
#define MAX_FD 65536
#define BUF 16384
/* Room before a response read into an empty buffer, for the `Connection: close` line. */
#define HEADROOM 32

static const char CLOSE_LINE[] = "\r\nConnection: close\r\n"; /* in a request head */
static const char CLOSE_HEADER[] = "Connection: close\r\n";   /* added to a response */
#define CLOSE_LINE_LEN (sizeof(CLOSE_LINE) - 1)
#define CLOSE_HEADER_LEN (sizeof(CLOSE_HEADER) - 1)

/* Bytes read from one side and not yet written to the other: data[off..len). */
struct buf {
    size_t off, len;
    char data[BUF];
};

enum kind { LISTENER, CLIENT, UPSTREAM, DEAD };

/* What an epoll event points at; the first member of each end. */
struct end {
    enum kind kind;
    int fd;
    int registered; /* in the epoll set */
};

struct upstream;

struct client {
    struct end end;
    int in_flight; /* a request went upstream and its response is not written yet */
    int closing;   /* the request asked for Connection: close */
    struct upstream *up;
    struct buf req; /* client -> upstream */
    struct client *next_dead;
};

struct upstream {
    struct end end;
    struct client *cl; /* NULL while pooled */
    struct upstream *next; /* next in the pool, or in the dead list */
    struct buf resp;       /* upstream -> client */
};

static int ep;
static struct sockaddr_in upstream_addr;
static struct upstream *pool;
/* Ends closed during a batch of events, freed (clients: kept for reuse) after it: a
 * later event of the same batch may still point at them (it then sees DEAD). */
static struct client *dead_clients;
/* Freed client ends, reused by the next accepts (no malloc and free per connection
 * with `Connection: close`). */
static struct client *spare_clients;
static struct upstream *dead_upstreams;

/* Registers e for the rest of its life (a no-op once it is). */
static void watch(struct end *e) {
    if (e->registered)
        return;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.ptr = e};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, e->fd, &ev) < 0)
        die("epoll_ctl");
    e->registered = 1;
}

static void close_upstream(struct upstream *u) {
    close(u->end.fd); /* also removes it from the epoll set */
    u->end.kind = DEAD;
    u->next = dead_upstreams;
    dead_upstreams = u;
}

/* Back to the pool, clean (no request of the client outstanding on it). */
static void release_upstream(struct upstream *u) {
    u->cl = NULL;
    u->resp.off = u->resp.len = 0;
    u->next = pool;
    pool = u;
}

static void unpool(struct upstream *u) {
    for (struct upstream **p = &pool; *p; p = &(*p)->next)
        if (*p == u) {
            *p = u->next;
            return;
        }
}

/* A pooled upstream connection, or a new one (a blocking connect: loopback, and only
 * while the pool grows to the number of concurrent clients). */
static struct upstream *take_upstream(void) {
    struct upstream *u = pool;
    if (u) {
        pool = u->next;
        return u;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return NULL;
    if (connect(fd, (struct sockaddr *)&upstream_addr, sizeof(upstream_addr)) < 0 ||
        fd >= MAX_FD) {
        close(fd);
        return NULL;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    u = malloc(sizeof(*u));
    if (!u)
        die("malloc");
    u->end = (struct end){.kind = UPSTREAM, .fd = fd};
    u->cl = NULL;
    u->next = NULL;
    u->resp.off = u->resp.len = 0;
    /* Registered once for its whole life: responses, and an idle one's close. */
    watch(&u->end);
    return u;
}

/* Closes the client; its upstream goes back to the pool if no request is outstanding
 * on it, and is closed otherwise (a late response would go to the next client). */
static void close_client(struct client *c) {
    struct upstream *u = c->up;
    close(c->end.fd);
    c->end.kind = DEAD;
    c->next_dead = dead_clients;
    dead_clients = c;
    if (!u)
        return;
    c->up = NULL;
    if (c->in_flight || u->resp.len)
        close_upstream(u);
    else
        release_upstream(u);
}

/* Writes b to e; 1 when all is written, 0 when some waits for EPOLLOUT, -1 on error. */
static int flush(struct end *e, struct buf *b) {
    while (b->off < b->len) {
        ssize_t n = write(e->fd, b->data + b->off, b->len - b->off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                return -1;
            watch(e);
            return 0;
        }
        b->off += (size_t)n;
    }
    b->off = b->len = 0;
    return 1;
}

/* The response is written: the next request, or the end of the connection. */
static void response_written(struct client *c) {
    c->in_flight = 0;
    if (c->closing)
        close_client(c);
    else
        watch(&c->end); /* kept alive: its next request is an edge */
}

static void forward_request(struct client *c) {
    struct upstream *u = c->up;
    if (flush(&u->end, &c->req) < 0) {
        c->in_flight = 1; /* the upstream is in an unknown state: close it too */
        close_client(c);
    }
}

static void client_readable(struct client *c) {
    struct buf *b = &c->req;
    if (b->len == sizeof(b->data)) {
        close_client(c);
        return;
    }
    int fresh = b->len == 0 && !c->in_flight;
    size_t room = sizeof(b->data) - b->len;
    ssize_t n = read(c->end.fd, b->data + b->len, room);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        watch(&c->end);
        return;
    }
    if (n <= 0 || (size_t)n == room) {
        close_client(c);
        return;
    }
    size_t start = b->len;
    b->len += (size_t)n;
    if (fresh) {
        char *line = memmem(b->data + start, (size_t)n, CLOSE_LINE, CLOSE_LINE_LEN);
        if (line) {
            /* Drop "Connection: close\r\n", keep the CRLF that ended the line before. */
            char *from = line + CLOSE_LINE_LEN, *to = line + 2;
            memmove(to, from, (size_t)(b->data + b->len - from));
            b->len -= CLOSE_LINE_LEN - 2;
            c->closing = 1;
        }
    }
    c->in_flight = 1;
    forward_request(c);
}

static void upstream_readable(struct upstream *u) {
    struct client *c = u->cl;
    if (!c) {
        /* Pooled: the upstream closed it (or sent what nobody asked for). */
        unpool(u);
        close_upstream(u);
        return;
    }
    struct buf *b = &u->resp;
    size_t at = b->len ? b->len : HEADROOM;
    if (at == sizeof(b->data)) {
        close_client(c);
        return;
    }
    ssize_t n = read(u->end.fd, b->data + at, sizeof(b->data) - at);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0 || (size_t)n == sizeof(b->data) - at) {
        close_client(c); /* in flight or not, the upstream is gone: closed with it */
        return;
    }
    if (!b->len) {
        b->off = HEADROOM;
        b->len = HEADROOM + (size_t)n;
        char *eol = c->closing ? memchr(b->data + HEADROOM, '\n', (size_t)n) : NULL;
        if (eol) {
            /* The status line moves back to make room for the header after it. */
            size_t status_len = (size_t)(eol + 1 - (b->data + HEADROOM));
            b->off = HEADROOM - CLOSE_HEADER_LEN;
            memmove(b->data + b->off, b->data + HEADROOM, status_len);
            memcpy(b->data + b->off + status_len, CLOSE_HEADER, CLOSE_HEADER_LEN);
        }
    } else {
        b->len += (size_t)n;
    }
    int r = flush(&c->end, b);
    if (r < 0)
        close_client(c);
    else if (r > 0)
        response_written(c);
}

static void accept_clients(int ls) {
    for (;;) {
        /* Not accept_nodelay: TCP_NODELAY is set on the listener and accepted
           sockets inherit it (Linux), which saves a setsockopt per connection. */
        int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
        if (fd < 0)
            return;
        if (fd >= MAX_FD) {
            close(fd);
            continue;
        }
        struct upstream *u = take_upstream();
        if (!u) {
            close(fd);
            continue;
        }
        struct client *c = spare_clients;
        if (c)
            spare_clients = c->next_dead;
        else if (!(c = malloc(sizeof(*c))))
            die("malloc");
        c->end = (struct end){.kind = CLIENT, .fd = fd};
        c->in_flight = c->closing = 0;
        c->up = u;
        c->req.off = c->req.len = 0;
        c->next_dead = NULL;
        u->cl = c;
        /* The request is usually there already: read it now, register only if not. */
        client_readable(c);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT UPSTREAM_PORT\n", argv[0]);
        return 2;
    }
    upstream_addr = (struct sockaddr_in){.sin_family = AF_INET,
                                         .sin_port = htons((uint16_t)atoi(argv[2])),
                                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ls = floor_listener(argv[1]);
    static struct end listener;
    listener = (struct end){.kind = LISTENER, .fd = ls, .registered = 1};
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
            struct end *e = events[i].data.ptr;
            uint32_t ev = events[i].events;
            switch (e->kind) {
            case LISTENER:
                accept_clients(ls);
                break;
            case CLIENT: {
                struct client *c = (struct client *)e;
                /* An EPOLLOUT edge matters only while a response waits to be written. */
                if ((ev & EPOLLOUT) && c->up && c->up->resp.len) {
                    int r = flush(&c->end, &c->up->resp);
                    if (r < 0) {
                        close_client(c);
                        break;
                    }
                    if (r > 0)
                        response_written(c);
                    if (c->end.kind == DEAD)
                        break;
                }
                if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR))
                    client_readable(c);
                break;
            }
            case UPSTREAM: {
                struct upstream *u = (struct upstream *)e;
                if ((ev & EPOLLOUT) && u->cl && u->cl->req.len) {
                    if (flush(&u->end, &u->cl->req) < 0) {
                        u->cl->in_flight = 1;
                        close_client(u->cl);
                        break;
                    }
                }
                if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR))
                    upstream_readable(u);
                break;
            }
            case DEAD:
                break;
            }
        }
        while (dead_clients) {
            struct client *c = dead_clients;
            dead_clients = c->next_dead;
            c->next_dead = spare_clients;
            spare_clients = c;
        }
        while (dead_upstreams) {
            struct upstream *u = dead_upstreams;
            dead_upstreams = u->next;
            free(u);
        }
    }
}
