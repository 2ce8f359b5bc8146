//! The virtio-vgpu device interface: queues, request and response headers, status codes and the
//! config space. `guest-shim/kmod/vgpu_virtio.h` is the C side of this page; a test checks that
//! the two agree.
//!
//! A request is one descriptor chain. Its device-readable part is one byte stream:
//!
//! ```text
//! struct virtio_vgpu_req (32 bytes) | inline bytes (inline_len) | request data (the rest)
//! ```
//!
//! and its device-writable part another:
//!
//! ```text
//! struct virtio_vgpu_resp (16 bytes) | reply area (reply_cap) | reply data (the rest)
//! ```
//!
//! For a `CALL`, the inline bytes are a vgpu protocol frame (24-byte header and the message's
//! fields) and the request data is the rest of the frame's payload: the bulk bytes of
//! `MemcpyHtoD`, `ModuleLoad` or `LaunchKernel`, normally descriptors that point straight at the
//! guest application's pinned pages. The reply frame (header and fields) goes into the reply area,
//! and the bulk bytes of a `MemcpyDtoH` reply into the reply data, again the application's pages.
//! Both split points are byte offsets, so a driver may put the headers and the inline bytes in one
//! descriptor or several.
//!
//! With [`F_BATCH`] negotiated, a `BATCH` request on the submission queue carries several
//! asynchronous frames back to back in its inline bytes (each a 24-byte header and its whole
//! payload; no request data), `reply_cap` of them, taking the sequence numbers `seq`, `seq + 1`, …:
//! one chain, one completion and one notification for a burst of kernel launches or memsets. The
//! device returns the chain once every frame of it has run.

use vgpu_proto::frame::{HEADER_LEN, MAX_PAYLOAD};

/// The control queue: synchronous calls, session open and close.
pub const CTRL_QUEUE: usize = 0;
/// The submission queue: asynchronous calls (no reply frame).
pub const SUBMIT_QUEUE: usize = 1;
/// Number of virtqueues.
pub const NUM_QUEUES: usize = 2;

/// Version of this device interface (headers, config space), in the config space.
pub const DEVICE_VERSION: u32 = 1;
/// Size of `struct virtio_vgpu_req`.
pub const REQ_HEADER_LEN: usize = 32;
/// Size of `struct virtio_vgpu_resp`.
pub const RESP_HEADER_LEN: usize = 16;
/// Size of `struct virtio_vgpu_config`.
pub const CONFIG_SIZE: usize = 96;
/// `magic` of the config space ("VGPU" little-endian, as the protocol's frame magic): the guest
/// module binds only devices that carry it, whatever their device ID.
pub const CONFIG_MAGIC: u32 = 0x5550_4756;
/// Bytes of the GPU name in the config space (NUL-padded UTF-8).
pub const CONFIG_NAME_LEN: usize = 64;

/// Most descriptors in one request chain (the virtio limit is the queue size; the driver uses the
/// smaller of the two).
pub const MAX_SEGMENTS: usize = 1024;
/// Most inline bytes of a request (frame header plus fields).
pub const MAX_INLINE: usize = 64 << 10;
/// Most bytes of request data in one request: a whole frame payload.
pub const MAX_DATA: usize = MAX_PAYLOAD;
/// Largest reply area the device fills: a whole reply frame.
pub const MAX_REPLY: usize = HEADER_LEN + MAX_PAYLOAD;

/// Request type: open session `session`.
pub const REQ_OPEN: u32 = 1;
/// Request type: a protocol frame of session `session`.
pub const REQ_CALL: u32 = 2;
/// Request type: close session `session`, releasing everything it holds.
pub const REQ_CLOSE: u32 = 3;
/// Request type: several asynchronous frames of session `session` (with [`F_BATCH`]).
pub const REQ_BATCH: u32 = 4;

/// Device feature bit: the device takes `BATCH` requests.
pub const F_BATCH: u64 = 0;
/// Most frames in one `BATCH` request.
pub const MAX_BATCH_FRAMES: usize = 512;

/// Done (for a call: the reply frame is in the reply area, or it was asynchronous).
pub const S_OK: u32 = 0;
/// The request is malformed: bad header, layout, sequence number or segment.
pub const S_BAD_REQUEST: u32 = 1;
/// No such session (never opened, closed, or ended by a device reset).
pub const S_NO_SESSION: u32 = 2;
/// Too many sessions, or the session id is in use.
pub const S_BUSY: u32 = 3;
/// The reply frame does not fit the reply area; `reply_len` says how large it is. The call was
/// executed.
pub const S_REPLY_TOO_LARGE: u32 = 4;
/// The session broke the vgpu protocol (say, a first frame that is not `Hello`) and was closed.
pub const S_PROTOCOL: u32 = 5;

/// A status code's name, for logs.
pub fn status_name(s: u32) -> &'static str {
    match s {
        S_OK => "ok",
        S_BAD_REQUEST => "bad request",
        S_NO_SESSION => "no such session",
        S_BUSY => "busy",
        S_REPLY_TOO_LARGE => "reply too large",
        S_PROTOCOL => "protocol violation",
        _ => "unknown",
    }
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

/// `struct virtio_vgpu_req`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReqHeader {
    /// `REQ_OPEN`, `REQ_CALL`, `REQ_CLOSE` or `REQ_BATCH`.
    pub kind: u32,
    /// Session id chosen by the driver (non-zero).
    pub session: u32,
    /// `CALL`: the session's sequence number, 1, 2, 3… in submission order over both queues
    /// (`BATCH`: its first frame's).
    pub seq: u64,
    /// `CALL`: bytes of the frame carried inline after this header (`BATCH`: of all its frames).
    pub inline_len: u32,
    /// `CALL` on the control queue: bytes of the reply area after the response header. `BATCH`:
    /// the number of frames.
    pub reply_cap: u32,
    /// Must be zero.
    pub reserved: u64,
}

impl ReqHeader {
    /// Encodes the header.
    pub fn to_bytes(&self) -> [u8; REQ_HEADER_LEN] {
        let mut b = [0u8; REQ_HEADER_LEN];
        b[0..4].copy_from_slice(&self.kind.to_le_bytes());
        b[4..8].copy_from_slice(&self.session.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..20].copy_from_slice(&self.inline_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.reply_cap.to_le_bytes());
        b[24..32].copy_from_slice(&self.reserved.to_le_bytes());
        b
    }

    /// Decodes the header.
    pub fn from_bytes(b: &[u8; REQ_HEADER_LEN]) -> Self {
        ReqHeader {
            kind: u32_at(b, 0),
            session: u32_at(b, 4),
            seq: u64_at(b, 8),
            inline_len: u32_at(b, 16),
            reply_cap: u32_at(b, 20),
            reserved: u64_at(b, 24),
        }
    }
}

/// `struct virtio_vgpu_resp`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RespHeader {
    /// `S_*`.
    pub status: u32,
    /// Bytes written to the reply area (with `S_REPLY_TOO_LARGE`: bytes needed).
    pub reply_len: u32,
    /// Bytes written to the reply data.
    pub data_len: u64,
}

impl RespHeader {
    /// A response with only a status.
    pub fn status(status: u32) -> Self {
        RespHeader {
            status,
            ..Default::default()
        }
    }

    /// Encodes the header.
    pub fn to_bytes(&self) -> [u8; RESP_HEADER_LEN] {
        let mut b = [0u8; RESP_HEADER_LEN];
        b[0..4].copy_from_slice(&self.status.to_le_bytes());
        b[4..8].copy_from_slice(&self.reply_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.data_len.to_le_bytes());
        b
    }

    /// Decodes the header.
    pub fn from_bytes(b: &[u8; RESP_HEADER_LEN]) -> Self {
        RespHeader {
            status: u32_at(b, 0),
            reply_len: u32_at(b, 4),
            data_len: u64_at(b, 8),
        }
    }
}

/// `struct virtio_vgpu_config`, the device's config space (read-only, little-endian).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigSpace {
    /// [`DEVICE_VERSION`].
    pub device_version: u32,
    /// [`MAX_SEGMENTS`].
    pub max_segments: u32,
    /// The VM's memory slice in bytes (live: a resize shows at the next read).
    pub slice_size: u64,
    /// [`MAX_INLINE`].
    pub max_inline: u32,
    /// [`MAX_DATA`].
    pub max_data: u32,
    /// The vgpu protocol version the device speaks (`vgpu_proto::PROTOCOL_VERSION`).
    pub protocol_version: u32,
    /// [`CONFIG_MAGIC`].
    pub magic: u32,
    /// The GPU's name (truncated to [`CONFIG_NAME_LEN`] bytes at a character boundary).
    pub name: String,
}

impl ConfigSpace {
    /// Encodes the config space.
    pub fn to_bytes(&self) -> [u8; CONFIG_SIZE] {
        let mut b = [0u8; CONFIG_SIZE];
        b[0..4].copy_from_slice(&self.device_version.to_le_bytes());
        b[4..8].copy_from_slice(&self.max_segments.to_le_bytes());
        b[8..16].copy_from_slice(&self.slice_size.to_le_bytes());
        b[16..20].copy_from_slice(&self.max_inline.to_le_bytes());
        b[20..24].copy_from_slice(&self.max_data.to_le_bytes());
        b[24..28].copy_from_slice(&self.protocol_version.to_le_bytes());
        b[28..32].copy_from_slice(&self.magic.to_le_bytes());
        let mut end = self.name.len().min(CONFIG_NAME_LEN - 1);
        while !self.name.is_char_boundary(end) {
            end -= 1;
        }
        b[32..32 + end].copy_from_slice(&self.name.as_bytes()[..end]);
        b
    }

    /// Decodes the config space (the name up to its first NUL).
    pub fn from_bytes(b: &[u8; CONFIG_SIZE]) -> Self {
        let name = &b[32..32 + CONFIG_NAME_LEN];
        let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        ConfigSpace {
            device_version: u32_at(b, 0),
            max_segments: u32_at(b, 4),
            slice_size: u64_at(b, 8),
            max_inline: u32_at(b, 16),
            max_data: u32_at(b, 20),
            protocol_version: u32_at(b, 24),
            magic: u32_at(b, 28),
            name: String::from_utf8_lossy(&name[..end]).into_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let r = ReqHeader {
            kind: REQ_CALL,
            session: 7,
            seq: 0x1122_3344_5566_7788,
            inline_len: 48,
            reply_cap: 4096,
            reserved: 0,
        };
        assert_eq!(ReqHeader::from_bytes(&r.to_bytes()), r);
        assert_eq!(
            &r.to_bytes()[8..16],
            &0x1122_3344_5566_7788u64.to_le_bytes()
        );
        let s = RespHeader {
            status: S_REPLY_TOO_LARGE,
            reply_len: 9000,
            data_len: 1 << 33,
        };
        assert_eq!(RespHeader::from_bytes(&s.to_bytes()), s);
    }

    /// The guest module's copy of this interface (`guest-shim/kmod/vgpu_virtio.h`) agrees.
    #[test]
    fn the_c_header_agrees() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../guest-shim/kmod/vgpu_virtio.h");
        let text = std::fs::read_to_string(&path).unwrap();
        let define = |name: &str| -> u64 {
            let line = text
                .lines()
                .find(|l| l.split_whitespace().nth(1) == Some(name) && l.starts_with("#define"))
                .unwrap_or_else(|| panic!("{name} is not defined in {}", path.display()));
            let v = line.split_whitespace().nth(2).unwrap();
            match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
                None => v.parse().unwrap(),
            }
        };
        let pairs: [(&str, u64); 22] = [
            ("VIRTIO_VGPU_CTRL_QUEUE", CTRL_QUEUE as u64),
            ("VIRTIO_VGPU_SUBMIT_QUEUE", SUBMIT_QUEUE as u64),
            ("VIRTIO_VGPU_NUM_QUEUES", NUM_QUEUES as u64),
            ("VIRTIO_VGPU_DEVICE_VERSION", u64::from(DEVICE_VERSION)),
            ("VIRTIO_VGPU_REQ_OPEN", u64::from(REQ_OPEN)),
            ("VIRTIO_VGPU_REQ_CALL", u64::from(REQ_CALL)),
            ("VIRTIO_VGPU_REQ_CLOSE", u64::from(REQ_CLOSE)),
            ("VIRTIO_VGPU_REQ_BATCH", u64::from(REQ_BATCH)),
            ("VIRTIO_VGPU_F_BATCH", F_BATCH),
            ("VIRTIO_VGPU_MAX_BATCH_FRAMES", MAX_BATCH_FRAMES as u64),
            ("VIRTIO_VGPU_S_OK", u64::from(S_OK)),
            ("VIRTIO_VGPU_S_BAD_REQUEST", u64::from(S_BAD_REQUEST)),
            ("VIRTIO_VGPU_S_NO_SESSION", u64::from(S_NO_SESSION)),
            ("VIRTIO_VGPU_S_BUSY", u64::from(S_BUSY)),
            (
                "VIRTIO_VGPU_S_REPLY_TOO_LARGE",
                u64::from(S_REPLY_TOO_LARGE),
            ),
            ("VIRTIO_VGPU_S_PROTOCOL", u64::from(S_PROTOCOL)),
            ("VIRTIO_VGPU_REQ_HEADER_LEN", REQ_HEADER_LEN as u64),
            ("VIRTIO_VGPU_RESP_HEADER_LEN", RESP_HEADER_LEN as u64),
            ("VIRTIO_VGPU_CONFIG_SIZE", CONFIG_SIZE as u64),
            ("VIRTIO_VGPU_NAME_LEN", CONFIG_NAME_LEN as u64),
            ("VIRTIO_VGPU_CONFIG_MAGIC", u64::from(CONFIG_MAGIC)),
            (
                "VGPU_FRAME_HEADER_LEN",
                vgpu_proto::frame::HEADER_LEN as u64,
            ),
        ];
        for (name, want) in pairs {
            assert_eq!(define(name), want, "{name}");
        }
        assert_eq!(
            define("VIRTIO_ID_VGPU_DEFAULT"),
            u64::from(crate::DEFAULT_DEVICE_ID)
        );
        assert_eq!(
            define("VIRTIO_ID_VGPU_QEMU"),
            u64::from(crate::QEMU_DEVICE_ID)
        );
        // What the config module tells VMM users (and vgpuctl attach-args prints).
        use vgpu_config::{VGPU_CONFIG_SIZE, VGPU_QUEUE_SIZE, VGPU_QUEUES};
        assert_eq!(
            (VGPU_QUEUES, VGPU_CONFIG_SIZE, usize::from(VGPU_QUEUE_SIZE)),
            (NUM_QUEUES, CONFIG_SIZE, MAX_SEGMENTS)
        );
    }

    #[test]
    fn config_space_layout_and_name_truncation() {
        let c = ConfigSpace {
            device_version: DEVICE_VERSION,
            max_segments: 1024,
            slice_size: 3 << 30,
            max_inline: MAX_INLINE as u32,
            max_data: MAX_DATA as u32,
            protocol_version: 1,
            magic: CONFIG_MAGIC,
            name: "é".repeat(40),
        };
        let b = c.to_bytes();
        assert_eq!(&b[8..16], &(3u64 << 30).to_le_bytes());
        let back = ConfigSpace::from_bytes(&b);
        // 63 bytes available: 31 two-byte characters, never half of one.
        assert_eq!(back.name, "é".repeat(31));
        assert_eq!(b[32 + 63], 0, "always NUL-terminated");
        assert_eq!(back.slice_size, 3 << 30);
        assert_eq!(&b[28..32], b"VGPU");
    }
}
