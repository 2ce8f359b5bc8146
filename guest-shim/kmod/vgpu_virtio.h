/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The virtio-vgpu device interface (device side: vgpud, vmm-backend/vhost-vgpu/src/wire.rs).
 *
 * A request is one descriptor chain. Its device-readable bytes are
 *   struct virtio_vgpu_req | inline bytes (inline_len) | request data (the rest)
 * and its device-writable bytes
 *   struct virtio_vgpu_resp | reply area (reply_cap) | reply data (the rest).
 * For a CALL the inline bytes are a vgpu protocol frame (24-byte header plus the message's
 * fields); the request data is the rest of the frame's payload (bulk bytes), the reply area gets
 * the reply frame and the reply data the reply's bulk bytes (MemcpyDtoH).
 *
 * With VIRTIO_VGPU_F_BATCH, a BATCH request on the submission queue carries reply_cap
 * asynchronous frames back to back in its inline bytes (each a 24-byte header and its whole
 * payload, no request data), with the sequence numbers seq, seq + 1, ...; the device returns it
 * once all of them have run.
 */
#ifndef VGPU_VIRTIO_H
#define VGPU_VIRTIO_H

#include <linux/types.h>

/*
 * Device IDs the module binds: vgpud's default, outside the IDs the VIRTIO spec assigns, and the
 * one to use with QEMU's vhost-user-test-device-pci, which can present only IDs it has a name for
 * (21, the spec's Signal Distribution Module, has no Linux driver and no QEMU device). The module
 * parameter device_id adds a third. The config space magic tells a vgpu device from anything
 * else with these IDs.
 */
#define VIRTIO_ID_VGPU_DEFAULT		63
#define VIRTIO_ID_VGPU_QEMU		21
#define VIRTIO_VGPU_CONFIG_MAGIC	0x55504756	/* "VGPU" */

#define VIRTIO_VGPU_CTRL_QUEUE		0	/* synchronous calls, open, close */
#define VIRTIO_VGPU_SUBMIT_QUEUE	1	/* asynchronous calls */
#define VIRTIO_VGPU_NUM_QUEUES		2

#define VIRTIO_VGPU_DEVICE_VERSION	1

#define VIRTIO_VGPU_REQ_OPEN		1
#define VIRTIO_VGPU_REQ_CALL		2
#define VIRTIO_VGPU_REQ_CLOSE		3
#define VIRTIO_VGPU_REQ_BATCH		4

#define VIRTIO_VGPU_F_BATCH		0	/* device feature bit: BATCH requests */
#define VIRTIO_VGPU_MAX_BATCH_FRAMES	512

#define VIRTIO_VGPU_S_OK		0
#define VIRTIO_VGPU_S_BAD_REQUEST	1
#define VIRTIO_VGPU_S_NO_SESSION	2
#define VIRTIO_VGPU_S_BUSY		3
#define VIRTIO_VGPU_S_REPLY_TOO_LARGE	4
#define VIRTIO_VGPU_S_PROTOCOL		5

#define VIRTIO_VGPU_REQ_HEADER_LEN	32
#define VIRTIO_VGPU_RESP_HEADER_LEN	16
#define VIRTIO_VGPU_CONFIG_SIZE		96
#define VIRTIO_VGPU_NAME_LEN		64

/* The vgpu protocol frame header. */
#define VGPU_FRAME_HEADER_LEN		24
#define VGPU_FRAME_FLAGS_OFFSET		6
#define VGPU_FRAME_FLAG_ASYNC		1
#define VGPU_FRAME_PAYLOAD_LEN_OFFSET	16

struct virtio_vgpu_req {
	__le32 type;		/* VIRTIO_VGPU_REQ_* */
	__le32 session;		/* chosen by the driver, non-zero */
	__le64 seq;		/* CALL: 1, 2, 3... per session, in submission order (BATCH: first) */
	__le32 inline_len;	/* CALL: frame bytes after this header (BATCH: all frames') */
	__le32 reply_cap;	/* CALL on the control queue: bytes of the reply area; BATCH: frames */
	__le64 reserved;
};

struct virtio_vgpu_resp {
	__le32 status;		/* VIRTIO_VGPU_S_* */
	__le32 reply_len;	/* bytes in the reply area (S_REPLY_TOO_LARGE: bytes needed) */
	__le64 data_len;	/* bytes written to the reply data */
};

struct virtio_vgpu_config {
	__le32 device_version;
	__le32 max_segments;	/* most descriptors in one chain */
	__le64 slice_size;	/* the VM's memory slice in bytes */
	__le32 max_inline;	/* most inline bytes */
	__le32 max_data;	/* most request data bytes */
	__le32 protocol_version;
	__le32 magic;		/* VIRTIO_VGPU_CONFIG_MAGIC */
	__u8 name[VIRTIO_VGPU_NAME_LEN];	/* the GPU's name, NUL-padded */
};

#endif /* VGPU_VIRTIO_H */
