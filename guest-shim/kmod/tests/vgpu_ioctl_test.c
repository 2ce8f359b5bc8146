/*
 * vgpu_ioctl_test: hostile and buggy use of /dev/vgpuN, straight through the ioctls (no shim).
 *
 *   vgpu_ioctl_test [/dev/vgpu0]
 *
 * Every bad call must fail with its documented errno and leave the session and the kernel fine:
 * the test ends with a real handshake on the same file. Prints "ok ..." or "FAIL ..." per check;
 * the exit status is the number of failures.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../vgpu_uapi.h"
#include "../vgpu_virtio.h"

static int failures;

static void expect_errno(const char *what, int r, int want) {
    int got = r < 0 ? errno : 0;
    if (got == want) {
        printf("ok %s (%s)\n", what, want ? strerror(want) : "success");
    } else {
        printf("FAIL %s: got %s, want %s\n", what, got ? strerror(got) : "success",
               want ? strerror(want) : "success");
        failures++;
    }
}

/* A vgpu protocol frame header (docs/protocol.md). */
static void frame(uint8_t *f, uint16_t opcode, uint16_t flags, uint64_t call_id, uint32_t len) {
    uint32_t magic = 0x55504756;
    memcpy(f, &magic, 4);
    memcpy(f + 4, &opcode, 2);
    memcpy(f + 6, &flags, 2);
    memcpy(f + 8, &call_id, 8);
    memcpy(f + 16, &len, 4);
    memset(f + 20, 0, 4);
}

/* Opens a session on `path` and does the handshake as process `name`; the fd, or -1. */
static int open_session(const char *path, const char *name) {
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return -1;
    uint8_t hello[24 + 4 + 4 + 4 + 5 + 4 + 256];
    uint32_t v = 1, pid = (uint32_t)getpid(), n = 5, len = (uint32_t)strlen(name);
    if (len > 256)
        len = 256;
    uint8_t *p = hello + 24;
    memcpy(p, &v, 4); p += 4;
    memcpy(p, &pid, 4); p += 4;
    memcpy(p, &n, 4); p += 4;
    memcpy(p, "0.1.0", 5); p += 5;
    memcpy(p, &len, 4); p += 4;
    memcpy(p, name, len); p += len;
    frame(hello, 0x0001 /* Hello */, 0, 1, (uint32_t)(p - hello - 24));
    uint8_t reply[512];
    struct vgpu_call c = {
        .req = (uintptr_t)hello, .req_len = (uint32_t)(p - hello),
        .reply = (uintptr_t)reply, .reply_cap = sizeof reply,
    };
    uint32_t status = 1;
    if (ioctl(fd, VGPU_IOC_CALL, &c) == 0 && c.reply_len >= 24)
        memcpy(&status, reply + 20, 4);
    if (status != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/*
 * Many sessions with long process names make the VM's TenantInfo document (what vgpu-smi shows)
 * larger than the shim's 64 KiB reply buffer: the call reports EMSGSIZE with the size needed,
 * asking again with that much room works, and vgpu-smi (the shim asks again by itself) lists
 * every session.
 */
enum { MANY = 240, SMALL_REPLY = 64 * 1024 };
static void large_replies(const char *path, int fd) {
    static int fds[MANY];
    char name[300];
    int opened = 0;
    for (int i = 0; i < MANY; i++) {
        /* 254 characters: the broker keeps 256 of a process name. */
        snprintf(name, sizeof name, "%0236d-many-sessions-%03d", 0, i);
        fds[i] = open_session(path, name);
        if (fds[i] >= 0)
            opened++;
    }
    if (opened == MANY) {
        printf("ok %d more sessions with long process names\n", MANY);
    } else {
        printf("FAIL only %d of %d sessions opened\n", opened, MANY);
        failures++;
    }
    uint8_t req[24];
    frame(req, 0x0701 /* TenantInfo */, 0, 900, 0);
    uint8_t *small = malloc(SMALL_REPLY);
    struct vgpu_call c = {
        .req = (uintptr_t)req, .req_len = 24, .reply = (uintptr_t)small, .reply_cap = SMALL_REPLY,
    };
    int r = ioctl(fd, VGPU_IOC_CALL, &c);
    expect_errno("TenantInfo into 64 KiB", r, EMSGSIZE);
    uint32_t needed = c.reply_len;
    if (needed <= SMALL_REPLY) {
        printf("FAIL EMSGSIZE said %u bytes are needed\n", needed);
        failures++;
        needed = SMALL_REPLY;
    }
    /* With room to spare, as the shim asks: the document's figures are live and it may have
     * grown since. */
    uint32_t room = needed + needed / 8;
    uint8_t *big = malloc(room);
    frame(req, 0x0701, 0, 901, 0);
    c.reply = (uintptr_t)big;
    c.reply_cap = room;
    expect_errno("TenantInfo asked again with the size needed", ioctl(fd, VGPU_IOC_CALL, &c), 0);
    uint32_t status = 1;
    if (c.reply_len >= 24)
        memcpy(&status, big + 20, 4);
    int listed = 0;
    const char *mark = "-many-sessions-";
    for (uint32_t i = 24; c.reply_len <= room && i + strlen(mark) <= c.reply_len; i++)
        if (memcmp(big + i, mark, strlen(mark)) == 0)
            listed++;
    if (status == 0 && listed == MANY) {
        printf("ok a %u-byte TenantInfo lists all %d sessions\n", needed, listed);
    } else {
        printf("FAIL TenantInfo: status %u, %u of %u bytes, %d sessions listed\n", status,
               c.reply_len, needed, listed);
        failures++;
    }
    free(big);
    free(small);
    /* The sessions have no context: vgpu-smi lists them among the open sessions. */
    int smi = system("vgpu-smi --json > /tmp/vgpu-smi-many.json");
    char check[160];
    snprintf(check, sizeof check,
             "test \"$(grep -o -- -many-sessions- /tmp/vgpu-smi-many.json | wc -l)\" -eq %d", MANY);
    int shown = system(check);
    if (smi == 0 && shown == 0) {
        printf("ok vgpu-smi shows all %d sessions through a reply larger than 64 KiB\n", MANY);
    } else {
        printf("FAIL vgpu-smi with %d sessions: status %d, listing check %d\n", MANY, smi, shown);
        failures++;
    }
    for (int i = 0; i < MANY; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/*
 * VGPU_CALL_BATCH on a session after its Hello: malformed batches are refused by the module, a
 * full batch of asynchronous frames is queued, and a synchronous call after it is answered (the
 * batch took exactly as many sequence numbers as it had frames, or the device would wait).
 */
static void batches(int fd, const struct vgpu_call *good) {
    struct vgpu_info info;
    expect_errno("INFO before batches", ioctl(fd, VGPU_IOC_INFO, &info), 0);
    if (!(info.flags & VGPU_INFO_BATCH)) {
        printf("FAIL the device does not offer batches (flags %#x)\n", info.flags);
        failures++;
        return;
    }
    printf("ok the device takes batches\n");
    enum { MAX = VIRTIO_VGPU_MAX_BATCH_FRAMES };
    static uint8_t frames[(MAX + 1) * 24];
    /* Memsets without fields: the device refuses each later (an asynchronous error), harmlessly. */
    for (int i = 0; i <= MAX; i++)
        frame(frames + 24 * i, 0x0309 /* Memset */, 1 /* ASYNC */, 1000 + i, 0);
    struct vgpu_call b = { .req = (uintptr_t)frames, .req_len = 24 * MAX, .flags = VGPU_CALL_BATCH };
    struct vgpu_call c;
    c = b; c.req_len = 24 * (MAX + 1);
    expect_errno("a batch of one frame too many", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    c = b; c.req_len = 24 + 3;
    expect_errno("a batch with bytes after its last frame", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    c = b; c.data = (uintptr_t)frames; c.data_len = 24;
    expect_errno("a batch with bulk data", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    c = b; c.reply = (uintptr_t)frames; c.reply_cap = 64;
    expect_errno("a batch with a reply buffer", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    c = b; c.flags = VGPU_CALL_BATCH | VGPU_CALL_NOWAIT;
    expect_errno("a batch with NOWAIT", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    uint8_t sync_first[48];
    frame(sync_first, 0x0003 /* Ping */, 0, 1, 0);
    frame(sync_first + 24, 0x0309, 1, 2, 0);
    c = b; c.req = (uintptr_t)sync_first; c.req_len = sizeof sync_first;
    expect_errno("a batch with a synchronous frame", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    uint8_t cut[30];
    frame(cut, 0x0309, 1, 3, 100);
    c = b; c.req = (uintptr_t)cut; c.req_len = sizeof cut;
    expect_errno("a batch whose frame runs past its end", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    c = b; c.req = 0x1000;
    expect_errno("a batch at an unmapped address", ioctl(fd, VGPU_IOC_CALL, &c), EFAULT);
    expect_errno("a full batch", ioctl(fd, VGPU_IOC_CALL, &b), 0);
    c = b; c.req_len = 24;
    expect_errno("a batch of one", ioctl(fd, VGPU_IOC_CALL, &c), 0);
    uint8_t ping[24], reply[64];
    frame(ping, 0x0003 /* Ping */, 0, 5000, 0);
    c = *good; c.req = (uintptr_t)ping; c.reply = (uintptr_t)reply; c.reply_cap = sizeof reply;
    expect_errno("a call after the batches", ioctl(fd, VGPU_IOC_CALL, &c), 0);
    uint64_t id;
    memcpy(&id, reply + 8, 8);
    if (c.reply_len != 24 || id != 5000) {
        printf("FAIL the call after the batches: %u bytes, call id %llu\n", c.reply_len,
               (unsigned long long)id);
        failures++;
    }
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "/dev/vgpu0";
    int fd = open(path, O_RDWR);
    if (fd < 0) {
        printf("FAIL open %s: %s\n", path, strerror(errno));
        return 1;
    }
    struct vgpu_info info;
    expect_errno("VGPU_IOC_INFO", ioctl(fd, VGPU_IOC_INFO, &info), 0);
    printf("device id %u, session %u, slice %llu MiB, max_transfer %u, name %s\n", info.device_id,
           info.session, (unsigned long long)(info.slice_size >> 20), info.max_transfer, info.name);

    uint8_t req[64], reply[4096];
    frame(req, 0x0003 /* Ping */, 0, 1, 0);
    struct vgpu_call good = {
        .req = (uintptr_t)req, .req_len = 24, .reply = (uintptr_t)reply, .reply_cap = sizeof reply,
    };
    struct vgpu_call c;

    /* Bad argument pointers and sizes. */
    expect_errno("INFO into a NULL pointer", ioctl(fd, VGPU_IOC_INFO, NULL), EFAULT);
    expect_errno("CALL from a NULL pointer", ioctl(fd, VGPU_IOC_CALL, NULL), EFAULT);
    expect_errno("CALL from a kernel address", ioctl(fd, VGPU_IOC_CALL, (void *)0xffffffff81000000ul),
                 EFAULT);
    expect_errno("CALL with a wrong struct size",
                 ioctl(fd, _IOWR(VGPU_IOC_MAGIC, 2, char[40]), &good), ENOTTY);
    expect_errno("unknown ioctl", ioctl(fd, _IO(VGPU_IOC_MAGIC, 99)), ENOTTY);

    /* Lengths and flags out of range. */
    c = good; c.req_len = 0;
    expect_errno("req_len 0", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    c = good; c.req_len = 1u << 30;
    expect_errno("req_len 1 GiB", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    c = good; c.data_len = 1ull << 40; c.data = (uintptr_t)req;
    expect_errno("data_len 1 TiB", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    c = good; c.out_len = 1ull << 30; c.out = (uintptr_t)reply;
    expect_errno("out_len beyond max_transfer", ioctl(fd, VGPU_IOC_CALL, &c), E2BIG);
    c = good; c.reply_cap = 8;
    expect_errno("reply buffer smaller than a frame header", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    c = good; c.flags = 4;
    expect_errno("unknown flags", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    struct vgpu_wait w = { .ticket = 7 };
    expect_errno("wait for a ticket never issued", ioctl(fd, VGPU_IOC_WAIT, &w), ENOENT);
    w.ticket = 1ull << 40;
    expect_errno("wait for an absurd ticket", ioctl(fd, VGPU_IOC_WAIT, &w), ENOENT);
    expect_errno("wait with a bad pointer", ioctl(fd, VGPU_IOC_WAIT, (void *)8), EFAULT);

    /* Bad pointers inside the request. */
    c = good; c.req = 0;
    expect_errno("frame at NULL", ioctl(fd, VGPU_IOC_CALL, &c), EFAULT);
    c = good; c.req = 0xffffffff81000000ul;
    expect_errno("frame at a kernel address", ioctl(fd, VGPU_IOC_CALL, &c), EFAULT);
    c = good; c.data = 0x1000; c.data_len = 1 << 20;
    expect_errno("1 MiB of data at an unmapped address", ioctl(fd, VGPU_IOC_CALL, &c), EFAULT);
    c = good; c.data = ~0ull - 4095; c.data_len = 1 << 20;
    expect_errno("data that wraps the address space", ioctl(fd, VGPU_IOC_CALL, &c), EFAULT);
    void *ro = mmap(NULL, 65536, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    c = good; c.reply = (uintptr_t)ro; c.reply_cap = 65536;
    expect_errno("reply into read-only memory", ioctl(fd, VGPU_IOC_CALL, &c), EFAULT);
    c = good; c.out = (uintptr_t)ro; c.out_len = 4096;
    expect_errno("reply data into read-only memory", ioctl(fd, VGPU_IOC_CALL, &c), EFAULT);
    void *gone = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(gone, 1 << 20);
    c = good; c.out = (uintptr_t)gone; c.out_len = 1 << 20;
    expect_errno("reply data into unmapped memory", ioctl(fd, VGPU_IOC_CALL, &c), EFAULT);

    /* An asynchronous frame cannot have a reply. */
    uint8_t areq[24];
    frame(areq, 0x0309 /* Memset */, 1 /* ASYNC */, 2, 0);
    c = good; c.req = (uintptr_t)areq;
    expect_errno("asynchronous frame with a reply buffer", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);

    /* Garbage frames reach the device and are refused there; the session goes on. */
    uint8_t junk[24];
    memset(junk, 0x5a, sizeof junk);
    c = good; c.req = (uintptr_t)junk;
    expect_errno("a frame with a bad magic", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);
    uint8_t lying[24];
    frame(lying, 0x0003, 0, 3, 1000);
    c = good; c.req = (uintptr_t)lying;
    expect_errno("a frame whose payload_len lies", ioctl(fd, VGPU_IOC_CALL, &c), EINVAL);

    /* The first real frame must be Hello: the device ends the session otherwise. Do the
     * handshake on a second file; on the first, a Ping breaks the protocol. */
    int fd2 = open(path, O_RDWR);
    struct vgpu_info info2;
    expect_errno("second open", ioctl(fd2, VGPU_IOC_INFO, &info2), 0);
    if (info2.session == info.session) {
        printf("FAIL two files share session %u\n", info.session);
        failures++;
    }
    uint8_t hello[24 + 4 + 4 + 4 + 5 + 4 + 5];
    uint8_t *p = hello + 24;
    uint32_t v = 1, pid = (uint32_t)getpid(), n = 5;
    memcpy(p, &v, 4); p += 4;
    memcpy(p, &pid, 4); p += 4;
    memcpy(p, &n, 4); p += 4;
    memcpy(p, "0.1.0", 5); p += 5;
    memcpy(p, &n, 4); p += 4;
    memcpy(p, "ioctl", 5); p += 5;
    frame(hello, 0x0001 /* Hello */, 0, 1, (uint32_t)(p - hello - 24));
    c = good; c.req = (uintptr_t)hello; c.req_len = (uint32_t)(p - hello);
    expect_errno("Hello on the second file after all that", ioctl(fd2, VGPU_IOC_CALL, &c), 0);
    uint32_t status;
    memcpy(&status, reply + 20, 4);
    if (c.reply_len < 24 || status != 0) {
        printf("FAIL Hello reply: %u bytes, status %u\n", c.reply_len, status);
        failures++;
    } else {
        printf("ok Hello answered (%u bytes)\n", c.reply_len);
    }

    batches(fd2, &good);

    /* Queued calls: tickets redeemed in any order, each once; a bounded number outstanding. */
    uint8_t pings[64][24], replies[64][64];
    struct vgpu_call q[65];
    int queued = 0;
    for (int i = 0; i < 65; i++) {
        frame(pings[i % 64], 0x0003 /* Ping */, 0, 100 + i, 0);
        q[i] = (struct vgpu_call){
            .req = (uintptr_t)pings[i % 64], .req_len = 24, .reply = (uintptr_t)replies[i % 64],
            .reply_cap = 64, .flags = VGPU_CALL_NOWAIT,
        };
        int r = ioctl(fd2, VGPU_IOC_CALL, &q[i]);
        if (i < 64) {
            if (r == 0 && q[i].ticket != 0) queued++;
        } else {
            expect_errno("a 65th call not waited for", r, EAGAIN);
        }
    }
    if (queued == 64) {
        printf("ok 64 calls queued without waiting\n");
    } else {
        printf("FAIL only %d calls queued\n", queued);
        failures++;
    }
    int redeemed = 0;
    for (int i = 63; i >= 0; i--) {
        struct vgpu_wait wt = { .ticket = q[i].ticket };
        uint64_t id = 0;
        int r = ioctl(fd2, VGPU_IOC_WAIT, &wt);
        /* The reply is the caller's only once its ticket has been waited for. */
        if (r == 0)
            memcpy(&id, replies[i] + 8, 8);
        if (r == 0 && wt.reply_len == 24 && id == (uint64_t)(100 + i))
            redeemed++;
    }
    if (redeemed == 64) {
        printf("ok 64 tickets redeemed in reverse order, each with its own reply\n");
    } else {
        printf("FAIL %d of 64 tickets redeemed\n", redeemed);
        failures++;
    }
    w.ticket = q[0].ticket;
    expect_errno("a ticket redeemed twice", ioctl(fd2, VGPU_IOC_WAIT, &w), ENOENT);
    /* Left for close to clean up: a queued call nobody waits for. */
    c = good; c.flags = VGPU_CALL_NOWAIT; c.req = (uintptr_t)pings[0];
    expect_errno("a call queued and never waited for", ioctl(fd2, VGPU_IOC_CALL, &c), 0);

    large_replies(path, fd2);

    expect_errno("Ping before Hello breaks the first session", ioctl(fd, VGPU_IOC_CALL, &good), EPROTO);
    expect_errno("that session is gone", ioctl(fd, VGPU_IOC_CALL, &good), ENOTCONN);

    /* A closed file descriptor. */
    close(fd);
    expect_errno("ioctl on a closed fd", ioctl(fd, VGPU_IOC_INFO, &info), EBADF);
    close(fd2);
    printf("vgpu_ioctl_test: %d failures\n", failures);
    return failures;
}
