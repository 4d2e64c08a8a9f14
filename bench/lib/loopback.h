/* bench/lib/loopback.h — what the benchmarks' small C servers share: dying with the
 * reason, and a non-blocking listener on 127.0.0.1. Included by
 * bench/proxy/upstream.c, bench/floors/proxy.c and bench/overload/upstream.c (each
 * built alone with `cc -O2`, so everything here is static; the functions a program
 * may not use are inline, so it builds without -Wunused-function warnings). */
#ifndef FORKD_BENCH_LOOPBACK_H
#define FORKD_BENCH_LOOPBACK_H

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* A non-blocking TCP listener on 127.0.0.1:PORT (a decimal string), SO_REUSEADDR,
 * with a deep backlog; exits on failure. */
static inline int loopback_listener(const char *port) {
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (ls < 0)
        die("socket");
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(port)),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(ls, (struct sockaddr *)&addr, sizeof(addr)) < 0)
        die("bind");
    if (listen(ls, 4096) < 0)
        die("listen");
    return ls;
}

/* A loopback listener as forkd's (a floor's): TCP_NODELAY (accepted sockets inherit it)
 * and TCP_DEFER_ACCEPT (a connection is accepted once its request is there). */
static inline int floor_listener(const char *port) {
    int ls = loopback_listener(port);
    int one = 1;
    if (setsockopt(ls, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
        die("setsockopt TCP_NODELAY");
    if (setsockopt(ls, IPPROTO_TCP, TCP_DEFER_ACCEPT, &one, sizeof(one)) < 0)
        die("setsockopt TCP_DEFER_ACCEPT");
    return ls;
}

/* An epoll instance with listener LS registered for reading (its events carry PTR),
 * then "ready" on stdout, which the benchmark scripts wait for. */
static inline int epoll_with_listener(int ls, void *ptr) {
    int ep = epoll_create1(0);
    if (ep < 0)
        die("epoll_create1");
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = ptr};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, ls, &lev) < 0)
        die("epoll_ctl listener");
    printf("ready\n");
    fflush(stdout);
    return ep;
}

/* The next connection waiting on listener LS, non-blocking and with TCP_NODELAY; -1
 * once none waits. A descriptor at or above LIMIT (the caller's table size) is
 * closed and skipped. */
static inline int accept_nodelay(int ls, int limit) {
    for (;;) {
        int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
        if (fd < 0)
            return -1;
        if (fd >= limit) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
    }
}

#endif
