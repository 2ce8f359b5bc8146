// SPDX-License-Identifier: GPL-2.0
/*
 * vgpu: driver for the virtio-vgpu paravirtual GPU served by vgpud.
 *
 * Every virtio-vgpu device becomes /dev/vgpuN. Every open file of it is one session of the vgpu
 * protocol on the device; VGPU_IOC_CALL sends one protocol frame (see vgpu_uapi.h):
 *
 *  - the frame's header and fields are copied into the kernel; small bulk bytes (up to
 *    VGPU_BOUNCE_MAX) too, so that small asynchronous calls (kernel launches, memsets) return at
 *    once;
 *  - larger bulk bytes, the reply buffer and the reply's bulk destination are the caller's own
 *    pages, pinned for the duration of the request (pin_user_pages_fast) and handed to the device
 *    as descriptors: vgpud reads and writes them in place;
 *  - synchronous frames go on the control queue and wait for the device; asynchronous ones on the
 *    submission queue. A per-session sequence number lets the device run them in submission
 *    order across both queues.
 *
 * Requests complete in the queues' interrupt callbacks; pages are unpinned in process context.
 * Closing the file closes the session (vgpud frees its GPU memory); removing the device fails
 * every outstanding request with ENODEV.
 */

#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/ktime.h>
#include <linux/rwsem.h>
#include <linux/scatterlist.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <asm/unaligned.h>

#include "vgpu_uapi.h"
#include "vgpu_virtio.h"

static unsigned int device_id;
module_param(device_id, uint, 0444);
MODULE_PARM_DESC(device_id, "another virtio device ID to bind (1-63), besides 63 and 21");

/*
 * Polling for answers (see vgpu_poll): the most a synchronous call polls before it sleeps, by
 * default and at most (µs); below VGPU_POLL_US_MIN an open file stops polling, and then one
 * wait in VGPU_POLL_PROBE_EVERY polls for the whole budget to see whether it pays again.
 */
#define VGPU_POLL_US_DEFAULT	1000
#define VGPU_POLL_US_MAX	10000
#define VGPU_POLL_US_MIN	8
#define VGPU_POLL_PROBE_EVERY	16

static unsigned int poll_us = VGPU_POLL_US_DEFAULT;
module_param(poll_us, uint, 0644);
MODULE_PARM_DESC(poll_us, "most microseconds a synchronous call polls the control queue for its answer before it sleeps until the interrupt; adapts per open file (0: never poll; at most 10000)");

/* Bulk bytes up to this size are copied instead of pinned. */
#define VGPU_BOUNCE_MAX		(16 * 1024)
/* Longest inline part (frame header and fields) the module accepts. */
#define VGPU_MAX_INLINE		(16 * 1024)
/* Largest reply buffer. */
#define VGPU_MAX_REPLY		(8 * 1024 * 1024 + VGPU_FRAME_HEADER_LEN)
/* Asynchronous requests in flight per open file before the caller waits. */
#define VGPU_MAX_ASYNC		256
/* Synchronous requests queued with VGPU_CALL_NOWAIT and not waited for, per open file. */
#define VGPU_MAX_TICKETS	64
/* Descriptors kept for the headers and a reply buffer of up to 64 KiB on any alignment. */
#define VGPU_RESERVED_SEGS	20
/* Bulk bytes that need too many descriptors are copied into chunks of this order. */
#define VGPU_CHUNK_ORDER	4
#define VGPU_CHUNK_SIZE		(PAGE_SIZE << VGPU_CHUNK_ORDER)
/* max_transfer is rounded down to this. */
#define VGPU_TRANSFER_ALIGN	(64 * 1024)
#define VGPU_MAX_DEVICES	64
#define VGPU_MIN_SEGMENTS	(VGPU_RESERVED_SEGS + 8)

static DEFINE_IDA(vgpu_index_ida);
static struct workqueue_struct *vgpu_wq;

struct vgpu_dev {
	struct virtio_device *vdev;
	struct virtqueue *vqs[VIRTIO_VGPU_NUM_QUEUES];
	spinlock_t vq_lock;		/* adds and get_buf on both queues */
	wait_queue_head_t space_wq;	/* a queue has room again, or the device died */
	struct rw_semaphore remove_sem;	/* held for reading while adding buffers */
	bool dead;
	struct kref ref;
	struct miscdevice misc;
	char name[16];
	int index;
	struct ida sessions;
	u32 max_segments;
	u32 max_inline;
	u32 max_data;
	u32 max_transfer;
};

struct vgpu_file {
	struct vgpu_dev *dev;
	u32 session;
	struct mutex submit_lock;	/* sequence order is queue order */
	u64 next_seq;
	atomic_t async_inflight;
	wait_queue_head_t async_wq;
	struct xarray tickets;		/* VGPU_CALL_NOWAIT requests not waited for yet */
	struct kref ref;		/* the open file and every request in flight */
	unsigned int poll_cur;		/* the current poll budget in µs (vgpu_poll) */
	unsigned int poll_idle;		/* waits without polling since the last probe */
};

struct vgpu_pin {
	struct page **pages;
	unsigned int npages;
	bool write;
	bool has_sgt;
	struct sg_table sgt;
};

struct vgpu_request {
	struct vgpu_file *file;
	struct vgpu_dev *dev;
	void *buf;			/* request header, inline bytes, small bulk bytes */
	size_t buf_len;
	struct virtio_vgpu_resp *resp;	/* device-writable */
	struct vgpu_pin data, reply, out;
	struct page **chunks;		/* bulk bytes copied in chunks */
	unsigned int nchunks;
	bool has_chunk_sgt;
	struct sg_table chunk_sgt;
	struct completion done;
	unsigned int used_len;
	int error;
	bool async;			/* nobody waits: cleaned up by the work item */
	bool in_async_count;
	bool completed;
	bool detached;			/* the waiter was killed: cleaned up by the work item */
	struct work_struct cleanup;
};

static void vgpu_dev_free(struct kref *ref)
{
	struct vgpu_dev *dev = container_of(ref, struct vgpu_dev, ref);

	ida_destroy(&dev->sessions);
	ida_free(&vgpu_index_ida, dev->index);
	kfree(dev);
}

static void vgpu_file_free(struct kref *ref)
{
	struct vgpu_file *f = container_of(ref, struct vgpu_file, ref);

	if (f->session)
		ida_free(&f->dev->sessions, f->session);
	xa_destroy(&f->tickets);
	kref_put(&f->dev->ref, vgpu_dev_free);
	kfree(f);
}

static void vgpu_unpin(struct vgpu_pin *p)
{
	if (p->has_sgt)
		sg_free_table(&p->sgt);
	if (p->pages) {
		if (p->npages)
			unpin_user_pages_dirty_lock(p->pages, p->npages, p->write);
		kvfree(p->pages);
	}
	memset(p, 0, sizeof(*p));
}

/* Pins [uaddr, uaddr + len) and describes it as a scatter-gather table (contiguous pages merged). */
static int vgpu_pin(struct vgpu_pin *p, u64 uaddr, u64 len, bool write)
{
	unsigned long offset = uaddr & ~PAGE_MASK;
	unsigned long npages;
	int pinned;
	int ret;

	memset(p, 0, sizeof(*p));
	if (!len)
		return 0;
	if (uaddr + len < uaddr || !access_ok(u64_to_user_ptr(uaddr), len))
		return -EFAULT;
	npages = DIV_ROUND_UP(offset + len, PAGE_SIZE);
	if (npages > INT_MAX / 2)
		return -EINVAL;
	p->pages = kvmalloc_array(npages, sizeof(*p->pages), GFP_KERNEL);
	if (!p->pages)
		return -ENOMEM;
	p->write = write;
	pinned = pin_user_pages_fast(uaddr & PAGE_MASK, npages, write ? FOLL_WRITE : 0, p->pages);
	if (pinned < 0) {
		kvfree(p->pages);
		p->pages = NULL;
		return pinned;
	}
	p->npages = pinned;
	if (pinned != npages) {
		vgpu_unpin(p);
		return -EFAULT;
	}
	ret = sg_alloc_table_from_pages_segment(&p->sgt, p->pages, npages, offset, len,
						UINT_MAX & PAGE_MASK, GFP_KERNEL);
	if (ret) {
		vgpu_unpin(p);
		return ret;
	}
	p->has_sgt = true;
	return 0;
}

static unsigned int vgpu_pin_nents(const struct vgpu_pin *p)
{
	return p->has_sgt ? p->sgt.nents : 0;
}

static void vgpu_free_chunks(struct vgpu_request *r)
{
	unsigned int i;

	if (r->has_chunk_sgt)
		sg_free_table(&r->chunk_sgt);
	for (i = 0; i < r->nchunks; i++)
		if (r->chunks[i])
			__free_pages(r->chunks[i], VGPU_CHUNK_ORDER);
	kfree(r->chunks);
	r->chunks = NULL;
	r->nchunks = 0;
	r->has_chunk_sgt = false;
}

/* Copies bulk bytes that would need too many descriptors into 64 KiB chunks. */
static int vgpu_copy_chunks(struct vgpu_request *r, u64 uaddr, u64 len)
{
	unsigned int n = DIV_ROUND_UP(len, VGPU_CHUNK_SIZE);
	struct scatterlist *sg;
	unsigned int i;
	int ret;

	r->chunks = kcalloc(n, sizeof(*r->chunks), GFP_KERNEL);
	if (!r->chunks)
		return -ENOMEM;
	r->nchunks = n;
	ret = sg_alloc_table(&r->chunk_sgt, n, GFP_KERNEL);
	if (ret)
		return ret;
	r->has_chunk_sgt = true;
	for_each_sg(r->chunk_sgt.sgl, sg, n, i) {
		u64 this = min_t(u64, VGPU_CHUNK_SIZE, len - (u64)i * VGPU_CHUNK_SIZE);

		r->chunks[i] = alloc_pages(GFP_KERNEL | __GFP_NOWARN, VGPU_CHUNK_ORDER);
		if (!r->chunks[i])
			return -ENOMEM;
		if (copy_from_user(page_address(r->chunks[i]),
				   u64_to_user_ptr(uaddr + (u64)i * VGPU_CHUNK_SIZE), this))
			return -EFAULT;
		sg_set_page(sg, r->chunks[i], this, 0);
	}
	return 0;
}

static struct vgpu_request *vgpu_request_alloc(struct vgpu_file *f, size_t buf_len)
{
	struct vgpu_request *r = kzalloc(sizeof(*r), GFP_KERNEL);

	if (!r)
		return NULL;
	r->buf = kzalloc(buf_len, GFP_KERNEL);
	r->resp = kzalloc(sizeof(*r->resp), GFP_KERNEL);
	if (!r->buf || !r->resp) {
		kfree(r->buf);
		kfree(r->resp);
		kfree(r);
		return NULL;
	}
	r->buf_len = buf_len;
	r->file = f;
	r->dev = f->dev;
	kref_get(&f->ref);
	init_completion(&r->done);
	return r;
}

static void vgpu_request_free(struct vgpu_request *r)
{
	struct vgpu_file *f = r->file;

	vgpu_unpin(&r->data);
	vgpu_unpin(&r->reply);
	vgpu_unpin(&r->out);
	vgpu_free_chunks(r);
	if (r->in_async_count) {
		atomic_dec(&f->async_inflight);
		wake_up(&f->async_wq);
	}
	kfree(r->buf);
	kfree(r->resp);
	kfree(r);
	kref_put(&f->ref, vgpu_file_free);
}

static void vgpu_cleanup_work(struct work_struct *work)
{
	vgpu_request_free(container_of(work, struct vgpu_request, cleanup));
}

/* Called with vq_lock held, from the interrupt callback or device removal. */
static void vgpu_complete_locked(struct vgpu_request *r)
{
	r->completed = true;
	if (r->async || r->detached) {
		INIT_WORK(&r->cleanup, vgpu_cleanup_work);
		queue_work(vgpu_wq, &r->cleanup);
	} else {
		complete(&r->done);
	}
}

/* Completes the requests the device returned on vq; called with vq_lock held. */
static bool vgpu_reap_locked(struct virtqueue *vq)
{
	struct vgpu_request *r;
	unsigned int len;
	bool any = false;

	while ((r = virtqueue_get_buf(vq, &len)) != NULL) {
		r->used_len = len;
		vgpu_complete_locked(r);
		any = true;
	}
	return any;
}

static void vgpu_vq_done(struct virtqueue *vq)
{
	struct vgpu_dev *dev = vq->vdev->priv;
	unsigned long flags;

	spin_lock_irqsave(&dev->vq_lock, flags);
	do {
		virtqueue_disable_cb(vq);
		vgpu_reap_locked(vq);
	} while (!virtqueue_enable_cb(vq));
	spin_unlock_irqrestore(&dev->vq_lock, flags);
	wake_up(&dev->space_wq);
}

static bool vgpu_has_room(struct vgpu_dev *dev, struct virtqueue *vq)
{
	bool room;

	spin_lock_irq(&dev->vq_lock);
	room = dev->dead || vq->num_free > 0;
	spin_unlock_irq(&dev->vq_lock);
	return room;
}

/*
 * Adds a request to queue q, waiting while the queue is full. A call (or a batch of `seqs`
 * calls) takes the session's next sequence number(s), written into the header first; the caller
 * holds the file's submit_lock.
 */
static int vgpu_submit(struct vgpu_request *r, int q, struct scatterlist **sgs,
		       unsigned int out_n, unsigned int in_n, u32 seqs)
{
	struct vgpu_dev *dev = r->dev;
	struct virtio_vgpu_req *hdr = r->buf;
	struct virtqueue *vq = dev->vqs[q];
	bool notify;
	int ret;

	for (;;) {
		down_read(&dev->remove_sem);
		if (dev->dead) {
			up_read(&dev->remove_sem);
			return -ENODEV;
		}
		spin_lock_irq(&dev->vq_lock);
		if (seqs)
			hdr->seq = cpu_to_le64(r->file->next_seq);
		ret = virtqueue_add_sgs(vq, sgs, out_n, in_n, r, GFP_ATOMIC);
		notify = false;
		if (!ret) {
			r->file->next_seq += seqs;
			notify = virtqueue_kick_prepare(vq);
		}
		spin_unlock_irq(&dev->vq_lock);
		if (notify)
			virtqueue_notify(vq);
		up_read(&dev->remove_sem);
		if (ret != -ENOSPC)
			return ret;
		ret = wait_event_killable(dev->space_wq, vgpu_has_room(dev, vq));
		if (ret)
			return ret;
	}
}

/*
 * The poll budget of a file for its next wait (µs), adapted as KVM's halt polling is: after a
 * wait whose answer came within the most poll_us allows (while polling, or soon after the
 * caller went to sleep, when a longer poll would have caught it) the whole budget; after a
 * longer wait (a synchronize behind long kernels, which polling cannot help) half of it, and
 * below VGPU_POLL_US_MIN none, except for one probe in VGPU_POLL_PROBE_EVERY waits. Threads of
 * one file race on these hints harmlessly.
 */
static unsigned int vgpu_poll_max(void)
{
	return min(READ_ONCE(poll_us), (unsigned int)VGPU_POLL_US_MAX);
}

static unsigned int vgpu_poll_budget(struct vgpu_file *f)
{
	unsigned int max = vgpu_poll_max();
	unsigned int cur = min(READ_ONCE(f->poll_cur), max);

	if (!max || cur)
		return cur;
	if (READ_ONCE(f->poll_idle) + 1 < VGPU_POLL_PROBE_EVERY) {
		WRITE_ONCE(f->poll_idle, READ_ONCE(f->poll_idle) + 1);
		return 0;
	}
	WRITE_ONCE(f->poll_idle, 0);
	return max;
}

static void vgpu_poll_record(struct vgpu_file *f, u64 waited_ns)
{
	unsigned int max = vgpu_poll_max();
	unsigned int half = min(READ_ONCE(f->poll_cur), max) / 2;

	if (waited_ns <= (u64)max * NSEC_PER_USEC)
		WRITE_ONCE(f->poll_cur, max);
	else
		WRITE_ONCE(f->poll_cur, half < VGPU_POLL_US_MIN ? 0 : half);
}

/*
 * Polls the control queue for a synchronous request's answer for up to `us` before the caller
 * sleeps. vgpud answers quick calls in microseconds, sooner than its interrupt travels through
 * the VMM and wakes this CPU from idle. Gives up early when the CPU is wanted elsewhere or a
 * signal is pending; the device's removal waits for it (remove_sem).
 */
static void vgpu_poll(struct vgpu_request *r, unsigned int us)
{
	struct vgpu_dev *dev = r->dev;
	bool reaped = false;
	u64 end;

	if (!us || !down_read_trylock(&dev->remove_sem))
		return;
	end = ktime_get_ns() + (u64)us * NSEC_PER_USEC;
	while (!READ_ONCE(dev->dead) && !completion_done(&r->done)) {
		if (need_resched() || signal_pending(current) || ktime_get_ns() > end)
			break;
		spin_lock_irq(&dev->vq_lock);
		reaped |= vgpu_reap_locked(dev->vqs[VIRTIO_VGPU_CTRL_QUEUE]);
		spin_unlock_irq(&dev->vq_lock);
		cpu_relax();
	}
	up_read(&dev->remove_sem);
	if (reaped)
		wake_up(&dev->space_wq);
}

/*
 * Waits for a request the caller owns, polling first for the file's budget (in a QEMU TCG
 * guest that halves a cuCtxSynchronize's round trip); on a fatal signal, leaves the request to
 * the cleanup work.
 */
static int vgpu_wait(struct vgpu_request *r)
{
	struct vgpu_dev *dev = r->dev;
	u64 start = ktime_get_ns();

	vgpu_poll(r, vgpu_poll_budget(r->file));
	if (wait_for_completion_killable(&r->done)) {
		spin_lock_irq(&dev->vq_lock);
		if (!r->completed) {
			r->detached = true;
			spin_unlock_irq(&dev->vq_lock);
			return -EINTR;
		}
		spin_unlock_irq(&dev->vq_lock);
		wait_for_completion(&r->done);
	}
	vgpu_poll_record(r->file, ktime_get_ns() - start);
	return 0;
}

static int vgpu_status_errno(u32 status)
{
	switch (status) {
	case VIRTIO_VGPU_S_OK:
		return 0;
	case VIRTIO_VGPU_S_BAD_REQUEST:
		return -EINVAL;
	case VIRTIO_VGPU_S_NO_SESSION:
		return -ENOTCONN;
	case VIRTIO_VGPU_S_BUSY:
		return -EBUSY;
	case VIRTIO_VGPU_S_REPLY_TOO_LARGE:
		return -EMSGSIZE;
	case VIRTIO_VGPU_S_PROTOCOL:
		return -EPROTO;
	default:
		return -EIO;
	}
}

/* The outcome of a completed request as an errno. */
static int vgpu_result(struct vgpu_request *r)
{
	if (r->error)
		return r->error;
	if (r->used_len < VIRTIO_VGPU_RESP_HEADER_LEN)
		return -EIO;
	return vgpu_status_errno(le32_to_cpu(r->resp->status));
}

/* OPEN or CLOSE of the file's session. CLOSE is not waited for. */
static int vgpu_session_request(struct vgpu_file *f, u32 type)
{
	struct scatterlist hdr_sg, resp_sg;
	struct scatterlist *sgs[2] = { &hdr_sg, &resp_sg };
	struct virtio_vgpu_req *hdr;
	struct vgpu_request *r;
	int ret;

	r = vgpu_request_alloc(f, sizeof(*hdr));
	if (!r)
		return -ENOMEM;
	hdr = r->buf;
	hdr->type = cpu_to_le32(type);
	hdr->session = cpu_to_le32(f->session);
	r->async = type == VIRTIO_VGPU_REQ_CLOSE;
	sg_init_one(&hdr_sg, r->buf, sizeof(*hdr));
	sg_init_one(&resp_sg, r->resp, sizeof(*r->resp));
	mutex_lock(&f->submit_lock);
	ret = vgpu_submit(r, VIRTIO_VGPU_CTRL_QUEUE, sgs, 1, 1, 0);
	mutex_unlock(&f->submit_lock);
	if (ret) {
		vgpu_request_free(r);
		return ret;
	}
	if (r->async)
		return 0;
	ret = vgpu_wait(r);
	if (ret)
		return ret;
	ret = vgpu_result(r);
	vgpu_request_free(r);
	return ret;
}

static long vgpu_ioctl_info(struct vgpu_file *f, void __user *arg)
{
	struct vgpu_dev *dev = f->dev;
	struct virtio_device *vdev = dev->vdev;
	struct vgpu_info info;
	u64 slice;

	memset(&info, 0, sizeof(info));
	down_read(&dev->remove_sem);
	if (dev->dead) {
		up_read(&dev->remove_sem);
		return -ENODEV;
	}
	virtio_cread_le(vdev, struct virtio_vgpu_config, device_version, &info.device_version);
	virtio_cread_le(vdev, struct virtio_vgpu_config, protocol_version, &info.protocol_version);
	virtio_cread_le(vdev, struct virtio_vgpu_config, slice_size, &slice);
	virtio_cread_bytes(vdev, offsetof(struct virtio_vgpu_config, name), info.name,
			   sizeof(info.name));
	up_read(&dev->remove_sem);
	info.name[sizeof(info.name) - 1] = 0;
	info.slice_size = slice;
	info.max_segments = dev->max_segments;
	info.max_inline = dev->max_inline;
	info.max_data = dev->max_data;
	info.max_transfer = dev->max_transfer;
	info.device_id = vdev->id.device;
	info.session = f->session;
	info.index = dev->index;
	if (virtio_has_feature(vdev, VIRTIO_VGPU_F_BATCH))
		info.flags |= VGPU_INFO_BATCH;
	if (copy_to_user(arg, &info, sizeof(info)))
		return -EFAULT;
	return 0;
}

/*
 * Counts a request nobody waits for among the file's asynchronous requests in flight, waiting
 * while there are VGPU_MAX_ASYNC of them; the wait's error on a fatal signal.
 */
static int vgpu_count_async(struct vgpu_request *r)
{
	struct vgpu_file *f = r->file;
	int ret;

	ret = wait_event_killable(f->async_wq, atomic_read(&f->async_inflight) < VGPU_MAX_ASYNC);
	if (ret)
		return ret;
	atomic_inc(&f->async_inflight);
	r->in_async_count = true;
	return 0;
}

/*
 * Counts the frames of a batch: asynchronous requests back to back, each its header and whole
 * payload, nothing after the last. Returns the count, or 0 when the bytes are not such frames.
 */
static u32 vgpu_batch_frames(const u8 *p, size_t len)
{
	u32 n = 0;

	while (len) {
		u16 flags;
		u32 payload;

		if (len < VGPU_FRAME_HEADER_LEN || n == VIRTIO_VGPU_MAX_BATCH_FRAMES)
			return 0;
		flags = get_unaligned_le16(p + VGPU_FRAME_FLAGS_OFFSET);
		payload = get_unaligned_le32(p + VGPU_FRAME_PAYLOAD_LEN_OFFSET);
		if (!(flags & VGPU_FRAME_FLAG_ASYNC) || payload > len - VGPU_FRAME_HEADER_LEN)
			return 0;
		p += VGPU_FRAME_HEADER_LEN + payload;
		len -= VGPU_FRAME_HEADER_LEN + payload;
		n++;
	}
	return n;
}

/* VGPU_CALL_BATCH: several asynchronous frames without bulk data, one request, not waited for. */
static long vgpu_ioctl_batch(struct vgpu_file *f, const struct vgpu_call *c)
{
	struct vgpu_dev *dev = f->dev;
	struct scatterlist hdr_sg, resp_sg;
	struct scatterlist *sgs[2] = { &hdr_sg, &resp_sg };
	struct virtio_vgpu_req *hdr;
	struct vgpu_request *r;
	u32 frames;
	long ret;

	if (!virtio_has_feature(dev->vdev, VIRTIO_VGPU_F_BATCH))
		return -EOPNOTSUPP;
	if (c->data_len || c->reply_cap || c->out_len)
		return -EINVAL;
	if (c->req_len < VGPU_FRAME_HEADER_LEN || c->req_len > dev->max_inline)
		return -EINVAL;
	r = vgpu_request_alloc(f, VIRTIO_VGPU_REQ_HEADER_LEN + c->req_len);
	if (!r)
		return -ENOMEM;
	hdr = r->buf;
	if (copy_from_user((u8 *)r->buf + VIRTIO_VGPU_REQ_HEADER_LEN, u64_to_user_ptr(c->req),
			   c->req_len)) {
		ret = -EFAULT;
		goto out_free;
	}
	frames = vgpu_batch_frames((u8 *)r->buf + VIRTIO_VGPU_REQ_HEADER_LEN, c->req_len);
	if (!frames) {
		ret = -EINVAL;
		goto out_free;
	}
	hdr->type = cpu_to_le32(VIRTIO_VGPU_REQ_BATCH);
	hdr->session = cpu_to_le32(f->session);
	hdr->inline_len = cpu_to_le32(c->req_len);
	hdr->reply_cap = cpu_to_le32(frames);
	sg_init_one(&hdr_sg, r->buf, r->buf_len);
	sg_init_one(&resp_sg, r->resp, sizeof(*r->resp));
	r->async = true;
	ret = vgpu_count_async(r);
	if (ret)
		goto out_free;
	mutex_lock(&f->submit_lock);
	ret = vgpu_submit(r, VIRTIO_VGPU_SUBMIT_QUEUE, sgs, 1, 1, frames);
	mutex_unlock(&f->submit_lock);
	if (ret)
		goto out_free;
	return 0;
out_free:
	vgpu_request_free(r);
	return ret;
}

static long vgpu_ioctl_call(struct vgpu_file *f, struct vgpu_call __user *uarg)
{
	struct vgpu_dev *dev = f->dev;
	struct scatterlist hdr_sg, resp_sg;
	struct scatterlist *sgs[5];
	unsigned int out_n, in_n, nents;
	struct virtio_vgpu_req *hdr;
	struct vgpu_request *r;
	struct vgpu_call c;
	bool async, small, nowait;
	size_t inline_end;
	u32 ticket = 0;
	u16 frame_flags;
	long ret;

	if (copy_from_user(&c, uarg, sizeof(c)))
		return -EFAULT;
	if (c.flags == VGPU_CALL_BATCH)
		return vgpu_ioctl_batch(f, &c);
	if (c.flags & ~VGPU_CALL_NOWAIT)
		return -EINVAL;
	nowait = c.flags & VGPU_CALL_NOWAIT;
	if (c.req_len < VGPU_FRAME_HEADER_LEN || c.req_len > dev->max_inline)
		return -EINVAL;
	if (c.data_len > dev->max_data || c.reply_cap > VGPU_MAX_REPLY)
		return -EINVAL;
	if (c.out_len > dev->max_transfer)
		return -E2BIG;
	small = c.data_len <= VGPU_BOUNCE_MAX;
	inline_end = VIRTIO_VGPU_REQ_HEADER_LEN + c.req_len;
	r = vgpu_request_alloc(f, inline_end + (small ? c.data_len : 0));
	if (!r)
		return -ENOMEM;
	hdr = r->buf;
	if (copy_from_user((u8 *)r->buf + VIRTIO_VGPU_REQ_HEADER_LEN, u64_to_user_ptr(c.req),
			   c.req_len)) {
		ret = -EFAULT;
		goto out_free;
	}
	frame_flags = get_unaligned_le16((u8 *)r->buf + VIRTIO_VGPU_REQ_HEADER_LEN +
					 VGPU_FRAME_FLAGS_OFFSET);
	async = frame_flags & VGPU_FRAME_FLAG_ASYNC;
	if (async ? (c.reply_cap || c.out_len) : c.reply_cap < VGPU_FRAME_HEADER_LEN) {
		ret = -EINVAL;
		goto out_free;
	}
	hdr->type = cpu_to_le32(VIRTIO_VGPU_REQ_CALL);
	hdr->session = cpu_to_le32(f->session);
	hdr->inline_len = cpu_to_le32(c.req_len);
	hdr->reply_cap = cpu_to_le32(async ? 0 : c.reply_cap);

	/* Request bulk bytes: copied when small, else pinned, else copied in chunks. */
	if (small && c.data_len) {
		if (copy_from_user((u8 *)r->buf + inline_end, u64_to_user_ptr(c.data),
				   c.data_len)) {
			ret = -EFAULT;
			goto out_free;
		}
	} else if (c.data_len) {
		ret = vgpu_pin(&r->data, c.data, c.data_len, false);
		if (ret)
			goto out_free;
		if (vgpu_pin_nents(&r->data) > dev->max_segments - VGPU_RESERVED_SEGS) {
			vgpu_unpin(&r->data);
			ret = vgpu_copy_chunks(r, c.data, c.data_len);
			if (ret)
				goto out_free;
		}
	}
	if (!async) {
		ret = vgpu_pin(&r->reply, c.reply, c.reply_cap, true);
		if (ret)
			goto out_free;
		ret = vgpu_pin(&r->out, c.out, c.out_len, true);
		if (ret)
			goto out_free;
	}

	sg_init_one(&hdr_sg, r->buf, r->buf_len);
	sg_init_one(&resp_sg, r->resp, sizeof(*r->resp));
	out_n = 0;
	sgs[out_n++] = &hdr_sg;
	nents = 2;
	if (r->data.has_sgt) {
		sgs[out_n++] = r->data.sgt.sgl;
		nents += r->data.sgt.nents;
	} else if (r->has_chunk_sgt) {
		sgs[out_n++] = r->chunk_sgt.sgl;
		nents += r->chunk_sgt.nents;
	}
	in_n = 0;
	sgs[out_n + in_n++] = &resp_sg;
	if (r->reply.has_sgt) {
		sgs[out_n + in_n++] = r->reply.sgt.sgl;
		nents += r->reply.sgt.nents;
	}
	if (r->out.has_sgt) {
		sgs[out_n + in_n++] = r->out.sgt.sgl;
		nents += r->out.sgt.nents;
	}
	if (nents > dev->max_segments) {
		ret = -E2BIG;
		goto out_free;
	}

	/*
	 * Small asynchronous calls hold no user pages: nobody waits for them. With NOWAIT, neither
	 * do other asynchronous calls (their pages stay pinned until the device is done).
	 */
	r->async = async && (nowait || (!r->data.has_sgt && !r->has_chunk_sgt));
	if (r->async) {
		ret = vgpu_count_async(r);
		if (ret)
			goto out_free;
	} else if (nowait) {
		ret = xa_alloc(&f->tickets, &ticket, r, XA_LIMIT(1, VGPU_MAX_TICKETS), GFP_KERNEL);
		if (ret == -EBUSY)
			ret = -EAGAIN;
		if (ret)
			goto out_free;
	}
	mutex_lock(&f->submit_lock);
	ret = vgpu_submit(r, async ? VIRTIO_VGPU_SUBMIT_QUEUE : VIRTIO_VGPU_CTRL_QUEUE, sgs,
			  out_n, in_n, 1);
	mutex_unlock(&f->submit_lock);
	if (ret) {
		if (ticket)
			xa_erase(&f->tickets, ticket);
		goto out_free;
	}
	if (r->async)
		return 0;
	if (ticket)
		/* The request belongs to the ticket now: VGPU_IOC_WAIT or release frees it. */
		return put_user((u64)ticket, &uarg->ticket) ? -EFAULT : 0;
	ret = vgpu_wait(r);
	if (ret)
		return ret;	/* the request belongs to the cleanup work now */
	ret = vgpu_result(r);
	c.reply_len = le32_to_cpu(r->resp->reply_len);
	c.out_done = le64_to_cpu(r->resp->data_len);
	if ((ret == 0 || ret == -EMSGSIZE) &&
	    (put_user(c.reply_len, &uarg->reply_len) || put_user(c.out_done, &uarg->out_done)))
		ret = -EFAULT;
out_free:
	vgpu_request_free(r);
	return ret;
}

static long vgpu_ioctl_wait(struct vgpu_file *f, struct vgpu_wait __user *uarg)
{
	struct vgpu_request *r;
	struct vgpu_wait w;
	long ret;

	if (copy_from_user(&w, uarg, sizeof(w)))
		return -EFAULT;
	if (w.reserved || w.ticket == 0 || w.ticket > VGPU_MAX_TICKETS)
		return w.reserved ? -EINVAL : -ENOENT;
	r = xa_erase(&f->tickets, w.ticket);
	if (!r)
		return -ENOENT;
	ret = vgpu_wait(r);
	if (ret)
		return ret;	/* the request belongs to the cleanup work now */
	ret = vgpu_result(r);
	w.reply_len = le32_to_cpu(r->resp->reply_len);
	w.out_done = le64_to_cpu(r->resp->data_len);
	if ((ret == 0 || ret == -EMSGSIZE) &&
	    (put_user(w.reply_len, &uarg->reply_len) || put_user(w.out_done, &uarg->out_done)))
		ret = -EFAULT;
	vgpu_request_free(r);
	return ret;
}

/* Hands every ticket nobody will wait for to the cleanup work (or frees it if done). */
static void vgpu_drop_tickets(struct vgpu_file *f)
{
	struct vgpu_dev *dev = f->dev;
	struct vgpu_request *r;
	unsigned long id;
	bool done;

	xa_for_each(&f->tickets, id, r) {
		xa_erase(&f->tickets, id);
		spin_lock_irq(&dev->vq_lock);
		done = r->completed;
		if (!done)
			r->detached = true;
		spin_unlock_irq(&dev->vq_lock);
		if (done)
			vgpu_request_free(r);
	}
}

static long vgpu_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct vgpu_file *f = filp->private_data;

	if (READ_ONCE(f->dev->dead))
		return -ENODEV;
	switch (cmd) {
	case VGPU_IOC_INFO:
		return vgpu_ioctl_info(f, (void __user *)arg);
	case VGPU_IOC_CALL:
		return vgpu_ioctl_call(f, (struct vgpu_call __user *)arg);
	case VGPU_IOC_WAIT:
		return vgpu_ioctl_wait(f, (struct vgpu_wait __user *)arg);
	default:
		return -ENOTTY;
	}
}

static int vgpu_open(struct inode *inode, struct file *filp)
{
	struct miscdevice *misc = filp->private_data;
	struct vgpu_dev *dev = container_of(misc, struct vgpu_dev, misc);
	struct vgpu_file *f;
	int id;
	int ret;

	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	id = ida_alloc_range(&dev->sessions, 1, INT_MAX, GFP_KERNEL);
	if (id < 0) {
		kfree(f);
		return id;
	}
	kref_get(&dev->ref);
	f->dev = dev;
	f->session = id;
	f->next_seq = 1;
	f->poll_cur = VGPU_POLL_US_MAX;
	mutex_init(&f->submit_lock);
	atomic_set(&f->async_inflight, 0);
	init_waitqueue_head(&f->async_wq);
	xa_init_flags(&f->tickets, XA_FLAGS_ALLOC1);
	kref_init(&f->ref);
	ret = vgpu_session_request(f, VIRTIO_VGPU_REQ_OPEN);
	if (ret) {
		kref_put(&f->ref, vgpu_file_free);
		return ret;
	}
	filp->private_data = f;
	return nonseekable_open(inode, filp);
}

static int vgpu_release(struct inode *inode, struct file *filp)
{
	struct vgpu_file *f = filp->private_data;

	vgpu_drop_tickets(f);
	/* vgpud ends the session and frees its GPU memory; nothing to wait for here. */
	if (!READ_ONCE(f->dev->dead))
		vgpu_session_request(f, VIRTIO_VGPU_REQ_CLOSE);
	kref_put(&f->ref, vgpu_file_free);
	return 0;
}

static const struct file_operations vgpu_fops = {
	.owner = THIS_MODULE,
	.open = vgpu_open,
	.release = vgpu_release,
	.unlocked_ioctl = vgpu_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.llseek = no_llseek,
};

static int vgpu_probe(struct virtio_device *vdev)
{
	vq_callback_t *callbacks[VIRTIO_VGPU_NUM_QUEUES] = { vgpu_vq_done, vgpu_vq_done };
	static const char * const names[VIRTIO_VGPU_NUM_QUEUES] = { "ctrl", "submit" };
	struct vgpu_dev *dev;
	u32 version, magic, segs, ring, i;
	u64 transfer;
	int ret;

	if (!vdev->config->get) {
		dev_err(&vdev->dev, "the transport has no config space\n");
		return -EINVAL;
	}
	virtio_cread_le(vdev, struct virtio_vgpu_config, magic, &magic);
	if (magic != VIRTIO_VGPU_CONFIG_MAGIC) {
		dev_info(&vdev->dev, "virtio device %u is not a vgpu device (config magic %#x)\n",
			 vdev->id.device, magic);
		return -ENODEV;
	}
	virtio_cread_le(vdev, struct virtio_vgpu_config, device_version, &version);
	if (version != VIRTIO_VGPU_DEVICE_VERSION) {
		dev_err(&vdev->dev, "device interface version %u, this module speaks %u\n",
			version, VIRTIO_VGPU_DEVICE_VERSION);
		return -ENODEV;
	}
	dev = kzalloc(sizeof(*dev), GFP_KERNEL);
	if (!dev)
		return -ENOMEM;
	dev->vdev = vdev;
	spin_lock_init(&dev->vq_lock);
	init_waitqueue_head(&dev->space_wq);
	init_rwsem(&dev->remove_sem);
	kref_init(&dev->ref);
	ida_init(&dev->sessions);
	dev->index = ida_alloc_max(&vgpu_index_ida, VGPU_MAX_DEVICES - 1, GFP_KERNEL);
	if (dev->index < 0) {
		ret = dev->index;
		kfree(dev);
		return ret;
	}
	vdev->priv = dev;

	ret = virtio_find_vqs(vdev, VIRTIO_VGPU_NUM_QUEUES, dev->vqs, callbacks, names, NULL);
	if (ret)
		goto err_free;

	virtio_cread_le(vdev, struct virtio_vgpu_config, max_segments, &segs);
	for (i = 0; i < VIRTIO_VGPU_NUM_QUEUES; i++) {
		ring = virtqueue_get_vring_size(dev->vqs[i]);
		segs = min(segs, ring);
	}
	if (segs < VGPU_MIN_SEGMENTS) {
		dev_err(&vdev->dev, "%u descriptors per request are too few (need %u)\n", segs,
			VGPU_MIN_SEGMENTS);
		ret = -EINVAL;
		goto err_vqs;
	}
	dev->max_segments = segs;
	virtio_cread_le(vdev, struct virtio_vgpu_config, max_inline, &dev->max_inline);
	dev->max_inline = min_t(u32, dev->max_inline, VGPU_MAX_INLINE);
	virtio_cread_le(vdev, struct virtio_vgpu_config, max_data, &dev->max_data);
	/* Pages of a reply destination, on any alignment, beside the reserved descriptors. */
	transfer = (u64)(segs - VGPU_RESERVED_SEGS - 1) * PAGE_SIZE;
	transfer = min_t(u64, transfer, dev->max_data);
	dev->max_transfer = rounddown(transfer, VGPU_TRANSFER_ALIGN);

	snprintf(dev->name, sizeof(dev->name), "vgpu%d", dev->index);
	dev->misc.minor = MISC_DYNAMIC_MINOR;
	dev->misc.name = dev->name;
	dev->misc.fops = &vgpu_fops;
	dev->misc.mode = 0666;
	virtio_device_ready(vdev);
	ret = misc_register(&dev->misc);
	if (ret)
		goto err_reset;
	dev_info(&vdev->dev, "/dev/%s: virtio-vgpu device %u, %u descriptors per request, %u bytes per transfer\n",
		 dev->name, vdev->id.device, dev->max_segments, dev->max_transfer);
	return 0;

err_reset:
	virtio_reset_device(vdev);
err_vqs:
	vdev->config->del_vqs(vdev);
err_free:
	kref_put(&dev->ref, vgpu_dev_free);
	return ret;
}

static void vgpu_remove(struct virtio_device *vdev)
{
	struct vgpu_dev *dev = vdev->priv;
	struct vgpu_request *r;
	unsigned int i;

	misc_deregister(&dev->misc);
	down_write(&dev->remove_sem);
	WRITE_ONCE(dev->dead, true);
	up_write(&dev->remove_sem);
	/* The device uses no buffer after this; fail the ones it still had. */
	virtio_reset_device(vdev);
	spin_lock_irq(&dev->vq_lock);
	for (i = 0; i < VIRTIO_VGPU_NUM_QUEUES; i++) {
		while ((r = virtqueue_detach_unused_buf(dev->vqs[i])) != NULL) {
			r->error = -ENODEV;
			vgpu_complete_locked(r);
		}
	}
	spin_unlock_irq(&dev->vq_lock);
	wake_up_all(&dev->space_wq);
	vdev->config->del_vqs(vdev);
	dev_info(&vdev->dev, "/dev/%s removed\n", dev->name);
	kref_put(&dev->ref, vgpu_dev_free);
}

/* The IDs modprobe loads the module for. */
static const struct virtio_device_id vgpu_id_table[] = {
	{ VIRTIO_ID_VGPU_DEFAULT, VIRTIO_DEV_ANY_ID },
	{ VIRTIO_ID_VGPU_QEMU, VIRTIO_DEV_ANY_ID },
	{ 0 },
};

/* The IDs the driver binds: those above and the module parameter device_id. */
static struct virtio_device_id vgpu_bind_ids[ARRAY_SIZE(vgpu_id_table) + 1];

static unsigned int vgpu_features[] = {
	VIRTIO_VGPU_F_BATCH,
};

static struct virtio_driver vgpu_driver = {
	.driver.name = KBUILD_MODNAME,
	.driver.owner = THIS_MODULE,
	.feature_table = vgpu_features,
	.feature_table_size = ARRAY_SIZE(vgpu_features),
	.id_table = vgpu_bind_ids,
	.probe = vgpu_probe,
	.remove = vgpu_remove,
};

static int __init vgpu_init(void)
{
	int ret;

	if (device_id > 63) {
		pr_err("vgpu: device_id %u is outside 1-63 (virtio PCI devices 0x1041-0x107f)\n",
		       device_id);
		return -EINVAL;
	}
	memcpy(vgpu_bind_ids, vgpu_id_table, sizeof(vgpu_id_table));
	if (device_id && device_id != VIRTIO_ID_VGPU_DEFAULT && device_id != VIRTIO_ID_VGPU_QEMU) {
		vgpu_bind_ids[ARRAY_SIZE(vgpu_id_table) - 1].device = device_id;
		vgpu_bind_ids[ARRAY_SIZE(vgpu_id_table) - 1].vendor = VIRTIO_DEV_ANY_ID;
	}
	vgpu_wq = alloc_workqueue("vgpu", WQ_UNBOUND, 0);
	if (!vgpu_wq)
		return -ENOMEM;
	ret = register_virtio_driver(&vgpu_driver);
	if (ret)
		destroy_workqueue(vgpu_wq);
	return ret;
}

static void __exit vgpu_exit(void)
{
	unregister_virtio_driver(&vgpu_driver);
	destroy_workqueue(vgpu_wq);
}

module_init(vgpu_init);
module_exit(vgpu_exit);

MODULE_DEVICE_TABLE(virtio, vgpu_id_table);
MODULE_DESCRIPTION("virtio-vgpu paravirtual GPU (vgpu project)");
MODULE_LICENSE("GPL");
