/*
 * bench/large-bodies/upstream.c: the upstream of bench/large-bodies/run.
 *
 *   cc -O2 -Wall -Wextra -pthread -o upstream upstream.c && ./upstream PORT BODY_FILE
 *
 * One blocking thread per connection, keep-alive. GET /big is answered with BODY_FILE
 * whole (200, Content-Length, sent with sendfile: the upstream's own copy costs
 * nothing, so the proxy sets the pace). Any other request has its Content-Length body
 * (PUT, POST) read and dropped, and is answered 200 with the number of body bytes
 * received as the body, so the driver can check that all of them came through (and
 * that a readiness probe, GET /small, is answered "0").
 * No chunked bodies, no pipelining: the driver's curl sends neither. Prints "ready"
 * on stdout once listening.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../lib/loopback.h"

#define HEAD_MAX 16384
#define DRAIN 262144

static int body_fd;
static off_t body_size;

/* The value of Content-Length in head [p, p+n), or 0 when there is none. */
static unsigned long long content_length(const char *p, size_t n) {
    static const char field[] = "\ncontent-length:";
    const size_t len = sizeof(field) - 1;
    for (const char *end = p + n; p + len <= end; p++) {
        if (strncasecmp(p, field, len) == 0) {
            p += len;
            while (p < end && (*p == ' ' || *p == '\t'))
                p++;
            return strtoull(p, NULL, 10);
        }
    }
    return 0;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void *serve(void *arg) {
    int fd = (int)(long)arg;
    char *head = malloc(HEAD_MAX), *drain = malloc(DRAIN);
    size_t have = 0;
    if (!head || !drain)
        die("malloc");
    for (;;) {
        char *end;
        while (!(end = memmem(head, have, "\r\n\r\n", 4))) {
            if (have == HEAD_MAX)
                goto out;
            ssize_t n = recv(fd, head + have, HEAD_MAX - have, 0);
            if (n <= 0)
                goto out;
            have += (size_t)n;
        }
        size_t head_len = (size_t)(end + 4 - head);
        unsigned long long want = content_length(head, head_len);
        /* Body bytes that came with the head count first. */
        size_t extra = have - head_len;
        unsigned long long got = extra < want ? extra : want;
        size_t after = head_len + (size_t)got; /* start of what follows this request */
        while (got < want) {
            size_t ask = want - got < DRAIN ? (size_t)(want - got) : DRAIN;
            ssize_t n = recv(fd, drain, ask, 0);
            if (n <= 0)
                goto out;
            got += (unsigned long long)n;
        }
        int is_get = strncmp(head, "GET /big", 8) == 0;
        memmove(head, head + after, have - after);
        have -= after;
        char reply[256];
        if (is_get) {
            int len = snprintf(reply, sizeof(reply),
                               "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                               "Content-Length: %lld\r\n\r\n", (long long)body_size);
            if (send_all(fd, reply, (size_t)len) < 0)
                goto out;
            off_t off = 0;
            while (off < body_size) {
                ssize_t n = sendfile(fd, body_fd, &off, (size_t)(body_size - off));
                if (n < 0 && errno == EINTR)
                    continue;
                if (n <= 0)
                    goto out;
            }
        } else {
            char count[32];
            int clen = snprintf(count, sizeof(count), "%llu", got);
            int len = snprintf(reply, sizeof(reply),
                               "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                               "Content-Length: %d\r\n\r\n%s", clen, count);
            if (send_all(fd, reply, (size_t)len) < 0)
                goto out;
        }
    }
out:
    close(fd);
    free(head);
    free(drain);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT BODY_FILE\n", argv[0]);
        return 2;
    }
    body_fd = open(argv[2], O_RDONLY);
    struct stat st;
    if (body_fd < 0 || fstat(body_fd, &st) < 0)
        die(argv[2]);
    body_size = st.st_size;
    int ls = loopback_listener(argv[1]);
    int flags = fcntl(ls, F_GETFL);
    fcntl(ls, F_SETFL, flags & ~O_NONBLOCK); /* blocking accepts, one thread */
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            die("accept");
        }
        pthread_t t;
        if (pthread_create(&t, NULL, serve, (void *)(long)fd) != 0)
            die("pthread_create");
        pthread_detach(t);
    }
}
