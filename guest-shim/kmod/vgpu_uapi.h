/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * /dev/vgpuN: the ioctl interface of the vgpu guest module (guest-shim/kmod), used by the guest
 * shim (libcuda.so.1, guest-shim/src/devlink.rs).
 *
 * Every open file is one vgpu protocol session. VGPU_IOC_CALL sends one frame: its header and
 * fields from `req`, its bulk bytes straight from `data` (the module pins those pages, the device
 * reads them in place), and for a synchronous frame waits for the reply frame (into `reply`) and
 * the reply's bulk bytes (into `out`, pinned and written in place by the device).
 */
#ifndef VGPU_UAPI_H
#define VGPU_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define VGPU_IOC_MAGIC	'V'

struct vgpu_info {
	__u32 device_version;
	__u32 protocol_version;
	__u64 slice_size;	/* the VM's memory slice (read from the device now) */
	__u32 max_segments;	/* descriptors per request: the device's and the ring's limit */
	__u32 max_inline;	/* most bytes in req */
	__u32 max_data;		/* most bytes in data */
	__u32 max_transfer;	/* bytes of out (and of pinned data) one call always fits */
	__u32 device_id;	/* the virtio device ID */
	__u32 session;		/* this file's session id */
	__u32 index;		/* N of /dev/vgpuN */
	__u32 flags;		/* VGPU_INFO_* */
	char name[64];		/* the GPU's name */
};

/* In vgpu_info.flags: the device takes VGPU_CALL_BATCH. */
#define VGPU_INFO_BATCH		1

/*
 * In `flags`: VGPU_CALL_NOWAIT, VGPU_CALL_BATCH, or 0. The frame header's ASYNC flag picks the
 * queue.
 *
 * VGPU_CALL_NOWAIT returns once the frame is queued; the module keeps the pages pinned until the
 * device is done with them. An asynchronous frame then needs nothing more (a later synchronous
 * frame of the session completes after it). A synchronous frame gets a `ticket`, which
 * VGPU_IOC_WAIT redeems for the reply: the caller must not touch `reply` and `out` until then.
 * This lets the shim keep several chunks of one large copy in flight.
 */
#define VGPU_CALL_NOWAIT	1

/*
 * VGPU_CALL_BATCH (with VGPU_INFO_BATCH): `req` holds several asynchronous frames back to back,
 * each its 24-byte header and its whole payload (at most VIRTIO_VGPU_MAX_BATCH_FRAMES of them);
 * `data`, `reply` and `out` are unused (lengths 0). They go to the device as one request, in
 * order, and the call returns once they are queued, as for a small asynchronous frame.
 */
#define VGPU_CALL_BATCH		2

struct vgpu_call {
	__u64 req;		/* in: frame header and fields */
	__u64 data;		/* in: the frame's bulk bytes (payload after the fields) */
	__u64 reply;		/* in: buffer for the reply frame (synchronous frames) */
	__u64 out;		/* in: buffer for the reply's bulk bytes */
	__u32 req_len;		/* in: 24 <= req_len <= max_inline */
	__u32 reply_cap;	/* in: bytes of reply (synchronous: >= 24) */
	__u64 data_len;		/* in: <= max_data */
	__u64 out_len;		/* in: <= max_transfer */
	__u32 flags;		/* in: 0, VGPU_CALL_NOWAIT or VGPU_CALL_BATCH */
	__u32 reply_len;	/* out: bytes of the reply frame (EMSGSIZE: bytes needed) */
	__u64 out_done;		/* out: bulk bytes written to out */
	__u64 ticket;		/* out: VGPU_CALL_NOWAIT with a synchronous frame: for VGPU_IOC_WAIT */
};

/* VGPU_IOC_WAIT: waits for the synchronous frame queued with VGPU_CALL_NOWAIT as `ticket`. */
struct vgpu_wait {
	__u64 ticket;		/* in */
	__u32 reply_len;	/* out: as in struct vgpu_call */
	__u32 reserved;		/* in: 0 */
	__u64 out_done;		/* out: as in struct vgpu_call */
};

#define VGPU_IOC_INFO	_IOR(VGPU_IOC_MAGIC, 1, struct vgpu_info)
#define VGPU_IOC_CALL	_IOWR(VGPU_IOC_MAGIC, 2, struct vgpu_call)
#define VGPU_IOC_WAIT	_IOWR(VGPU_IOC_MAGIC, 3, struct vgpu_wait)

/*
 * Errors of VGPU_IOC_CALL: EFAULT (a pointer or page cannot be used), EINVAL (a length or flag
 * out of range, or the device refused the request as malformed), E2BIG (more pages than one
 * request can carry: use max_transfer), EMSGSIZE (the reply frame is larger than reply_cap; the
 * call was executed), ENOTCONN (the session is gone: device reset), EPROTO (the session broke the
 * protocol and was closed), EBUSY (too many sessions), ENODEV (the device was removed), EIO (the
 * device returned the request without a status), EAGAIN (VGPU_CALL_NOWAIT: too many tickets not
 * waited for yet). VGPU_IOC_WAIT fails with ENOENT for a ticket it does not know (never issued,
 * or already waited for), and otherwise as the call would have.
 */

#endif /* VGPU_UAPI_H */
