/*
 * vsock-echo: a tiny AF_VSOCK test program for vgpu guests.
 *
 *   vsock-echo connect CID PORT [BYTES [ROUNDS]]
 *       Connects to CID:PORT, sends BYTES bytes of a pattern ROUNDS times
 *       (in chunks; every chunk must come back before the next is sent) and
 *       checks that every byte is echoed. Defaults: 4096 bytes, 1 round.
 *   vsock-echo listen PORT [CONNECTIONS]
 *       Listens on PORT (any CID) and echoes CONNECTIONS connections one after
 *       the other (default 1), then exits.
 *   vsock-echo local-cid
 *       Prints this machine's CID (IOCTL_VM_SOCKETS_GET_LOCAL_CID on /dev/vsock).
 *
 * Every run prints lines starting with "VSOCK-ECHO" for the harness to match:
 *   VSOCK-ECHO connect ok cid=2 port=9000 bytes=4096 rounds=1 usec=812
 *   VSOCK-ECHO listening port=9000
 *   VSOCK-ECHO accepted cid=2 port=1035
 *   VSOCK-ECHO listen ok connections=1 bytes=4096
 *   VSOCK-ECHO local-cid 3
 *   VSOCK-ECHO <verb> error: <what>: <strerror>
 * Exit status: 0 success, 1 failure (the error line says why), 2 usage.
 * The whole run is bounded by VSOCK_ECHO_TIMEOUT seconds (default 30).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#define PREFIX "VSOCK-ECHO"
#define DEFAULT_BYTES 4096UL
#define DEFAULT_ROUNDS 1UL
#define DEFAULT_TIMEOUT_S 30U
#define CHUNK_BYTES (64UL * 1024UL)
#define MAX_BYTES (1UL << 30)
#define EXIT_FAIL 1
#define EXIT_USAGE 2

static const char *verb = "?";

static void fail(const char *what)
{
    printf(PREFIX " %s error: %s: %s\n", verb, what, strerror(errno));
    fflush(stdout);
    exit(EXIT_FAIL);
}

static void fail_msg(const char *what)
{
    printf(PREFIX " %s error: %s\n", verb, what);
    fflush(stdout);
    exit(EXIT_FAIL);
}

static void on_alarm(int sig)
{
    static const char msg[] = PREFIX " error: timed out (VSOCK_ECHO_TIMEOUT)\n";
    (void)sig;
    /* Only async-signal-safe calls here. */
    ssize_t unused = write(STDOUT_FILENO, msg, sizeof(msg) - 1);
    (void)unused;
    _exit(EXIT_FAIL);
}

static int usage(void)
{
    fprintf(stderr,
            "usage: vsock-echo connect CID PORT [BYTES [ROUNDS]]\n"
            "       vsock-echo listen PORT [CONNECTIONS]\n"
            "       vsock-echo local-cid\n");
    return EXIT_USAGE;
}

/* Parses a decimal number in [min, max]; returns 0 on success. */
static int parse_ulong(const char *s, unsigned long min, unsigned long max, unsigned long *out)
{
    char *end = NULL;
    unsigned long v;

    if (s == NULL || *s == '\0' || *s == '-')
        return -1;
    errno = 0;
    v = strtoul(s, &end, 10);
    if (errno != 0 || end == NULL || *end != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

static unsigned char pattern_byte(unsigned long round, unsigned long offset)
{
    return (unsigned char)((offset * 31UL + round * 7UL + 11UL) & 0xffUL);
}

static long long now_usec(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static void write_all(int fd, const unsigned char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            fail("send");
        }
        buf += n;
        len -= (size_t)n;
    }
}

static void read_all(int fd, unsigned char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = recv(fd, buf, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            fail("recv");
        }
        if (n == 0)
            fail_msg("recv: the peer closed the connection before echoing everything");
        buf += n;
        len -= (size_t)n;
    }
}

static int do_connect(int argc, char **argv)
{
    unsigned long cid, port, bytes = DEFAULT_BYTES, rounds = DEFAULT_ROUNDS;
    struct sockaddr_vm addr;
    unsigned char *out, *in;
    long long start, usec;
    int fd;

    if (argc < 2 || argc > 4)
        return usage();
    if (parse_ulong(argv[0], 0, UINT32_MAX, &cid) || parse_ulong(argv[1], 0, UINT32_MAX, &port) ||
        (argc > 2 && parse_ulong(argv[2], 1, MAX_BYTES, &bytes)) ||
        (argc > 3 && parse_ulong(argv[3], 1, UINT32_MAX, &rounds)))
        return usage();

    out = malloc(CHUNK_BYTES);
    in = malloc(CHUNK_BYTES);
    if (out == NULL || in == NULL)
        fail("malloc");

    fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        fail("socket(AF_VSOCK)");
    memset(&addr, 0, sizeof(addr));
    addr.svm_family = AF_VSOCK;
    addr.svm_cid = (unsigned int)cid;
    addr.svm_port = (unsigned int)port;
    start = now_usec();
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
        fail("connect");

    for (unsigned long r = 0; r < rounds; r++) {
        for (unsigned long off = 0; off < bytes; off += CHUNK_BYTES) {
            size_t len = bytes - off < CHUNK_BYTES ? (size_t)(bytes - off) : (size_t)CHUNK_BYTES;
            for (size_t i = 0; i < len; i++)
                out[i] = pattern_byte(r, off + i);
            write_all(fd, out, len);
            read_all(fd, in, len);
            for (size_t i = 0; i < len; i++) {
                if (in[i] != out[i]) {
                    printf(PREFIX " connect error: echo mismatch in round %lu at byte %lu: "
                                  "sent 0x%02x, got 0x%02x\n",
                           r, off + i, out[i], in[i]);
                    fflush(stdout);
                    return EXIT_FAIL;
                }
            }
        }
    }
    usec = now_usec() - start;
    close(fd);
    printf(PREFIX " connect ok cid=%lu port=%lu bytes=%lu rounds=%lu usec=%lld\n", cid, port, bytes,
           rounds, usec);
    free(out);
    free(in);
    return 0;
}

static int do_listen(int argc, char **argv)
{
    unsigned long port, connections = 1, total = 0;
    struct sockaddr_vm addr;
    unsigned char *buf;
    int lfd;

    if (argc < 1 || argc > 2)
        return usage();
    if (parse_ulong(argv[0], 0, UINT32_MAX, &port) ||
        (argc > 1 && parse_ulong(argv[1], 1, INT_MAX, &connections)))
        return usage();
    buf = malloc(CHUNK_BYTES);
    if (buf == NULL)
        fail("malloc");

    lfd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        fail("socket(AF_VSOCK)");
    memset(&addr, 0, sizeof(addr));
    addr.svm_family = AF_VSOCK;
    addr.svm_cid = VMADDR_CID_ANY;
    addr.svm_port = (unsigned int)port;
    if (bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
        fail("bind");
    if (listen(lfd, (int)connections) < 0)
        fail("listen");
    printf(PREFIX " listening port=%lu\n", port);
    fflush(stdout);

    for (unsigned long c = 0; c < connections; c++) {
        struct sockaddr_vm peer;
        socklen_t peer_len = sizeof(peer);
        int fd = accept4(lfd, (struct sockaddr *)&peer, &peer_len, SOCK_CLOEXEC);
        if (fd < 0)
            fail("accept");
        printf(PREFIX " accepted cid=%u port=%u\n", peer.svm_cid, peer.svm_port);
        fflush(stdout);
        for (;;) {
            ssize_t n = recv(fd, buf, CHUNK_BYTES, 0);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                fail("recv");
            }
            if (n == 0)
                break;
            write_all(fd, buf, (size_t)n);
            total += (unsigned long)n;
        }
        close(fd);
    }
    close(lfd);
    printf(PREFIX " listen ok connections=%lu bytes=%lu\n", connections, total);
    free(buf);
    return 0;
}

static int do_local_cid(int argc)
{
    unsigned int cid = 0;
    int fd;

    if (argc != 0)
        return usage();
    fd = open("/dev/vsock", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        fail("open /dev/vsock");
    if (ioctl(fd, IOCTL_VM_SOCKETS_GET_LOCAL_CID, &cid) < 0)
        fail("ioctl IOCTL_VM_SOCKETS_GET_LOCAL_CID");
    close(fd);
    if (cid == VMADDR_CID_ANY)
        printf(PREFIX " local-cid none\n");
    else
        printf(PREFIX " local-cid %u\n", cid);
    return 0;
}

int main(int argc, char **argv)
{
    unsigned long timeout_s = DEFAULT_TIMEOUT_S;
    const char *env = getenv("VSOCK_ECHO_TIMEOUT");

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (env != NULL && parse_ulong(env, 1, UINT_MAX, &timeout_s) != 0) {
        fprintf(stderr, "vsock-echo: VSOCK_ECHO_TIMEOUT must be a number of seconds\n");
        return EXIT_USAGE;
    }
    signal(SIGALRM, on_alarm);
    alarm((unsigned int)timeout_s);

    if (argc < 2)
        return usage();
    verb = argv[1];
    if (strcmp(verb, "connect") == 0)
        return do_connect(argc - 2, argv + 2);
    if (strcmp(verb, "listen") == 0)
        return do_listen(argc - 2, argv + 2);
    if (strcmp(verb, "local-cid") == 0)
        return do_local_cid(argc - 2);
    return usage();
}
