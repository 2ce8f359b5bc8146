//! Frames: a fixed 24-byte little-endian header followed by a payload.
//!
//! ```text
//! offset size field
//!      0    4 magic        0x55504756 ("VGPU" in memory order)
//!      4    2 opcode       message number (see `msg`)
//!      6    2 flags        FLAG_ASYNC | FLAG_REPLY | FLAG_OUTPUT
//!      8    8 call_id      chosen by the client, echoed in the reply
//!     16    4 payload_len  bytes after the header, <= MAX_PAYLOAD
//!     20    4 status       replies: the CUresult; requests: 0
//! ```

use std::io::{self, Read, Write};
use std::ops::ControlFlow;

use thiserror::Error;

/// Header magic, `b"VGPU"` read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"VGPU");
/// Size of the frame header in bytes.
pub const HEADER_LEN: usize = 24;
/// Largest payload either side accepts. Bulk copies larger than
/// [`MAX_BULK_CHUNK`] are split by the client.
pub const MAX_PAYLOAD: usize = 8 << 20;
/// Largest bulk data carried by one copy request or reply.
pub const MAX_BULK_CHUNK: usize = 4 << 20;

/// Request flag: the client wants no reply (an asynchronous call).
pub const FLAG_ASYNC: u16 = 1 << 0;
/// The frame is a reply.
pub const FLAG_REPLY: u16 = 1 << 1;
/// Reply flag, sent only to clients that enabled [`crate::msg::FEATURE_DEVICE_OUTPUT`]:
/// device-side `printf`/`assert` output is waiting; the client fetches it with
/// [`crate::msg::TakeOutput`]. The payload is unchanged.
pub const FLAG_OUTPUT: u16 = 1 << 2;
/// Flags a peer may set; any other bit is a protocol error (and `FLAG_OUTPUT` is one in a
/// request).
pub const KNOWN_FLAGS: u16 = FLAG_ASYNC | FLAG_REPLY | FLAG_OUTPUT;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message number.
    pub opcode: u16,
    /// `FLAG_*` bits.
    pub flags: u16,
    /// Call id chosen by the client.
    pub call_id: u64,
    /// Bytes of payload following the header.
    pub payload_len: u32,
    /// `CUresult` of a reply; 0 in requests.
    pub status: u32,
}

/// Why a frame was rejected.
#[derive(Debug, Error)]
pub enum FrameError {
    /// The magic did not match: the peer does not speak this protocol or the stream lost sync.
    #[error("bad frame magic {0:#010x}")]
    BadMagic(u32),
    /// A length past `MAX_PAYLOAD`.
    #[error("payload of {0} bytes exceeds the maximum of {MAX_PAYLOAD}")]
    TooLarge(u32),
    /// Unknown flag bits.
    #[error("unknown frame flags {0:#06x}")]
    BadFlags(u16),
    /// The stream ended in the middle of a frame.
    #[error("connection closed in the middle of a frame")]
    Truncated,
    /// The stream ended cleanly between frames.
    #[error("connection closed")]
    Closed,
    /// An I/O error.
    #[error("i/o error")]
    Io(#[source] io::Error),
}

impl From<FrameError> for io::Error {
    fn from(e: FrameError) -> io::Error {
        match e {
            FrameError::Io(e) => e,
            FrameError::Closed | FrameError::Truncated => {
                io::Error::new(io::ErrorKind::UnexpectedEof, e)
            }
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}

impl Header {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.opcode.to_le_bytes());
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.call_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.payload_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.status.to_le_bytes());
        b
    }

    /// Decodes and validates a header.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        let le32 = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let magic = le32(0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let h = Header {
            opcode: u16::from_le_bytes([b[4], b[5]]),
            flags: u16::from_le_bytes([b[6], b[7]]),
            call_id: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            payload_len: le32(16),
            status: le32(20),
        };
        if h.flags & !KNOWN_FLAGS != 0 {
            return Err(FrameError::BadFlags(h.flags));
        }
        if h.payload_len as usize > MAX_PAYLOAD {
            return Err(FrameError::TooLarge(h.payload_len));
        }
        Ok(h)
    }

    /// Whether the request asks for no reply.
    pub fn is_async(&self) -> bool {
        self.flags & FLAG_ASYNC != 0
    }

    /// Whether the frame is a reply.
    pub fn is_reply(&self) -> bool {
        self.flags & FLAG_REPLY != 0
    }

    /// Whether a reply says device output is waiting ([`FLAG_OUTPUT`]).
    pub fn has_output(&self) -> bool {
        self.flags & FLAG_OUTPUT != 0
    }
}

/// Reads one frame: its header, and its payload into `payload` (resized).
/// Returns `FrameError::Closed` on a clean end of stream before the header.
pub fn read_frame<R: Read>(r: &mut R, payload: &mut Vec<u8>) -> Result<Header, FrameError> {
    let h = read_header(r)?;
    read_payload(r, h.payload_len as usize, payload)?;
    Ok(h)
}

/// Reads and validates one frame's header, leaving its payload in the stream.
/// Returns `FrameError::Closed` on a clean end of stream before the header.
pub fn read_header<R: Read>(r: &mut R) -> Result<Header, FrameError> {
    let mut hb = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut hb[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Header::decode(&hb)
}

/// Reads the next `len` bytes of a frame's payload into `payload` (resized).
pub fn read_payload<R: Read>(
    r: &mut R,
    len: usize,
    payload: &mut Vec<u8>,
) -> Result<(), FrameError> {
    payload.clear();
    payload.resize(len, 0);
    r.read_exact(payload).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            FrameError::Truncated
        } else {
            FrameError::Io(e)
        }
    })
}

/// What [`ReadInPlace::read_in_place`] calls with the runs of bytes: `Send`, because a transport
/// may call it on the thread that receives the bytes while the reader waits for them.
pub type RunFn<'a> = dyn FnMut(&[&[u8]]) -> ControlFlow<()> + Send + 'a;

/// A byte stream that lends the bytes it holds instead of copying them out: a transport whose
/// buffer is in the receiver's memory (vgpud's in-process vsock rings) hands a frame's bulk bytes
/// straight to where they go.
pub trait ReadInPlace {
    /// Consumes the next `len` bytes, calling `f` with them in order, as runs of one or more
    /// slices as they arrive. Once `f` breaks, the rest of the `len` bytes is consumed without
    /// calls, so that the stream stays at a frame boundary. Fails with `UnexpectedEof` if the
    /// stream ends first.
    fn read_in_place(&mut self, len: usize, f: &mut RunFn<'_>) -> io::Result<()>;
}

/// What [`WriteInPlace::write_in_place`] calls with room for the next bytes, to fill all of it:
/// `Send`, because a transport may call it on the thread that sends the bytes while the writer
/// waits.
pub type FillFn<'a> = dyn FnMut(&mut [u8]) -> ControlFlow<()> + Send + 'a;

/// A byte stream that lets a writer produce bytes straight in the transport's buffer instead of
/// copying them in: vgpud's in-process vsock rings hand the guest's rx buffers to a large
/// device-to-host copy's reply, so that its bytes go from device memory to the guest in one copy.
pub trait WriteInPlace {
    /// Appends `len` bytes to the stream, produced by `f`: it is called with room for the next
    /// bytes, in order, until it has filled `len` bytes, possibly on another thread while this
    /// one waits. If `f` breaks, the bytes it did not fill are never sent and the call fails
    /// (`Other`): the frame they belong to cannot be completed, so the stream must end (vgpud's
    /// vsock rings shut it for writing at once). Fails with `BrokenPipe` once the peer is gone.
    fn write_in_place(&mut self, len: usize, f: &mut FillFn<'_>) -> io::Result<()>;
}

/// Answers frames on the thread that delivered their bytes (a vsock device's queue thread),
/// so that a quick call needs no hand-off to the thread that serves its stream.
pub trait AnswerHere: Send + Sync {
    /// Runs the complete frames at the front of the stream that can be answered at once and
    /// writes their replies ([`FrameRing::write_here`]). Never waits: it declines whenever the
    /// serving thread is busy.
    fn answer_here(&self) -> Answered;
}

/// What one [`AnswerHere::answer_here`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answered {
    /// Calls answered.
    pub calls: usize,
    /// Whether the stream's own reader must be woken for the bytes left: `false` only when none
    /// are left but the start of a frame the answerer will take once it is whole.
    pub wake_reader: bool,
}

/// A byte stream whose received bytes another thread may take whole frames from while the
/// stream's own reader waits (vgpud's in-process vsock rings): the reading side of
/// [`AnswerHere`].
pub trait FrameRing {
    /// Bytes readable now.
    fn readable(&self) -> usize;
    /// Copies the first readable bytes into `buf` without consuming them; returns how many.
    fn peek(&self, buf: &mut [u8]) -> usize;
    /// Consumes `n` readable bytes (at most [`FrameRing::readable`]).
    fn consume(&self, n: usize);
    /// Room for [`FrameRing::write_here`] now.
    fn writable(&self) -> usize;
    /// Writes as much of `buf` as fits, without waiting, for the thread that called
    /// [`AnswerHere::answer_here`] to deliver; returns how many bytes it took.
    fn write_here(&self, buf: &[u8]) -> io::Result<usize>;
    /// Produces up to `len` bytes with `f` straight in the room [`FrameRing::write_here`]
    /// writes to, without waiting (at most [`FrameRing::writable`] bytes); returns how many it
    /// produced, fewer than it could only where `f` broke.
    fn fill_here(&self, len: usize, f: &mut FillFn<'_>) -> io::Result<usize>;
    /// Waits until bytes are readable (`true`), the reader is kicked ([`FrameRing::kick`],
    /// `true`) or the stream ended with nothing left to read (`false`).
    fn wait_readable(&self) -> io::Result<bool>;
    /// Wakes a reader waiting in [`FrameRing::wait_readable`].
    fn kick(&self);
    /// Registers the answerer the delivering thread calls after each write (a weak reference:
    /// the answerer owns the stream).
    fn answer_with(&self, answerer: std::sync::Weak<dyn AnswerHere>);
}

/// The function of one [`ReadInPlace::read_in_place`] call, as its implementations offer it the
/// runs: it is called until it breaks once, then no more (the bytes are consumed all the same,
/// as the trait requires).
pub struct Borrower<'f> {
    f: &'f mut RunFn<'f>,
    wanted: bool,
}

impl<'f> Borrower<'f> {
    /// Offers runs to `f`.
    pub fn new(f: &'f mut RunFn<'f>) -> Self {
        Borrower { f, wanted: true }
    }

    /// Hands `runs` to the function if it has not broken yet.
    pub fn offer(&mut self, runs: &[&[u8]]) {
        if self.wanted {
            self.wanted = (self.f)(runs).is_continue();
        }
    }
}

/// Writes the header of a frame whose `payload_len` bytes of payload follow separately
/// ([`WriteInPlace`]).
pub fn write_header<W: Write>(
    w: &mut W,
    opcode: u16,
    flags: u16,
    call_id: u64,
    status: u32,
    payload_len: usize,
) -> io::Result<()> {
    let payload_len = u32::try_from(payload_len)
        .ok()
        .filter(|&l| l as usize <= MAX_PAYLOAD)
        .ok_or_else(|| io::Error::other(FrameError::TooLarge(u32::MAX)))?;
    let h = Header {
        opcode,
        flags,
        call_id,
        payload_len,
        status,
    };
    w.write_all(&h.encode())
}

/// Writes one frame whose payload is the concatenation of `parts`.
pub fn write_frame<W: Write>(
    w: &mut W,
    opcode: u16,
    flags: u16,
    call_id: u64,
    status: u32,
    parts: &[&[u8]],
) -> io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    write_header(w, opcode, flags, call_id, status, len)?;
    for p in parts {
        w.write_all(p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            opcode: 0x0301,
            flags: FLAG_ASYNC,
            call_id: 0x1122_3344_5566_7788,
            payload_len: 3,
            status: 0,
        }
    }

    #[test]
    fn header_layout_is_little_endian_and_fixed() {
        let b = sample().encode();
        assert_eq!(&b[0..4], b"VGPU");
        assert_eq!(&b[4..6], &[0x01, 0x03]);
        assert_eq!(&b[8..16], &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        assert_eq!(Header::decode(&b).unwrap(), sample());
    }

    #[test]
    fn bad_magic_flags_and_length_are_rejected() {
        let mut b = sample().encode();
        b[0] = b'X';
        assert!(matches!(Header::decode(&b), Err(FrameError::BadMagic(_))));
        let mut b = sample().encode();
        b[6] = 0x80;
        assert!(matches!(
            Header::decode(&b),
            Err(FrameError::BadFlags(0x80))
        ));
        let mut h = sample();
        h.payload_len = MAX_PAYLOAD as u32 + 1;
        assert!(matches!(
            Header::decode(&h.encode()),
            Err(FrameError::TooLarge(_))
        ));
    }

    #[test]
    fn frames_round_trip_through_a_stream() {
        let mut buf = Vec::new();
        write_frame(&mut buf, 7, FLAG_REPLY, 9, 2, &[b"ab", b"c"]).unwrap();
        let mut payload = Vec::new();
        let mut r = &buf[..];
        let h = read_frame(&mut r, &mut payload).unwrap();
        assert_eq!((h.opcode, h.call_id, h.status), (7, 9, 2));
        assert!(h.is_reply());
        assert_eq!(payload, b"abc");
        assert!(matches!(
            read_frame(&mut r, &mut payload),
            Err(FrameError::Closed)
        ));
    }

    #[test]
    fn a_frame_cut_short_is_truncated_not_closed() {
        let mut buf = Vec::new();
        write_frame(&mut buf, 7, 0, 1, 0, &[b"abcdef"]).unwrap();
        for cut in [1, HEADER_LEN - 1, HEADER_LEN + 2] {
            let mut r = &buf[..cut];
            let err = read_frame(&mut r, &mut Vec::new()).unwrap_err();
            assert!(matches!(err, FrameError::Truncated), "cut at {cut}: {err}");
        }
    }
}
