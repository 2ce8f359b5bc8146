//! virtio-vsock packet headers and validated access to descriptor chains.
//!
//! Every packet on the rx and tx queues starts with a 44-byte little-endian header
//! (`struct virtio_vsock_hdr`, virtio 1.2 §5.10.6) followed by `len` payload bytes. The header and
//! the payload may be split over any number of descriptors (Linux puts the header and the payload
//! of a tx packet in separate descriptors and an rx header plus its payload in one), so a chain is
//! treated as one byte stream made of validated guest-memory segments.
//!
//! Nothing here trusts the guest: every descriptor is checked for direction and for lying inside
//! guest memory before it is used, chains that do not terminate are refused, and the `len` field is
//! checked against the bytes the chain really holds.

use std::io;
use std::ops::ControlFlow;

use smallvec::SmallVec;
use thiserror::Error;
use vgpu_vhost_user::{
    ChainHead, Descriptors, GuestRegion, for_each_slice_of_ranges, in_memory, write_in_one_region,
};
use vm_memory::{GuestAddress, ReadVolatile, VolatileMemoryError, WriteVolatile};

/// Size of `struct virtio_vsock_hdr`.
pub const PKT_HEADER_SIZE: usize = 44;
/// Well-known CID of the host.
pub const VSOCK_HOST_CID: u64 = 2;
/// The only socket type this device supports.
pub const VSOCK_TYPE_STREAM: u16 = 1;

/// Connection request.
pub const VSOCK_OP_REQUEST: u16 = 1;
/// Connection accepted.
pub const VSOCK_OP_RESPONSE: u16 = 2;
/// Connection reset (refused or aborted).
pub const VSOCK_OP_RST: u16 = 3;
/// Sender will no longer receive and/or send (see the `SHUTDOWN_*` flags).
pub const VSOCK_OP_SHUTDOWN: u16 = 4;
/// Payload data.
pub const VSOCK_OP_RW: u16 = 5;
/// Unsolicited report of the sender's buffer space.
pub const VSOCK_OP_CREDIT_UPDATE: u16 = 6;
/// Request for a `CREDIT_UPDATE`.
pub const VSOCK_OP_CREDIT_REQUEST: u16 = 7;

/// `SHUTDOWN` flag: the sender will receive no more data.
pub const VSOCK_SHUTDOWN_RCV: u32 = 1;
/// `SHUTDOWN` flag: the sender will send no more data.
pub const VSOCK_SHUTDOWN_SEND: u32 = 2;
/// Both `SHUTDOWN` flags.
pub const VSOCK_SHUTDOWN_BOTH: u32 = VSOCK_SHUTDOWN_RCV | VSOCK_SHUTDOWN_SEND;

/// Largest payload one packet may carry. Linux never sends more
/// (`VIRTIO_VSOCK_MAX_PKT_BUF_SIZE`); a larger `len` is treated as hostile.
pub const MAX_PKT_PAYLOAD: u32 = 64 * 1024;

/// Most descriptors accepted in one chain (the largest split queue has 32768 entries; a real
/// driver uses one to a handful).
pub const MAX_CHAIN_DESCRIPTORS: usize = 1024;

/// Guest memory as seen by this device.
pub use vgpu_vhost_user::GuestMem;

/// Why a descriptor chain was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChainError {
    /// The chain has no descriptor at all (bad head index or unreadable descriptor table).
    #[error("descriptor chain is empty (bad head index or descriptor table outside guest memory)")]
    Empty,
    /// A descriptor points the wrong way for its queue.
    #[error("descriptor {index} is device-{found} on a queue that needs device-{wanted} buffers")]
    WrongDirection {
        /// Position of the descriptor in the chain.
        index: usize,
        /// "readable" or "writable".
        found: &'static str,
        /// "readable" or "writable".
        wanted: &'static str,
    },
    /// A descriptor's buffer is not entirely inside guest memory.
    #[error("descriptor {index} covers [{addr:#x}, +{len:#x}) which is outside guest memory")]
    OutsideMemory {
        /// Position of the descriptor in the chain.
        index: usize,
        /// Guest physical address of the buffer.
        addr: u64,
        /// Buffer length.
        len: u32,
    },
    /// The chain loops, has an out-of-range `next` index, or is absurdly long.
    #[error("descriptor chain does not terminate (loop, bad next index or over {0} descriptors)")]
    Unterminated(usize),
    /// Fewer bytes than one packet header.
    #[error("descriptor chain holds {0} bytes, less than the 44-byte packet header")]
    ShortHeader(usize),
    /// The header's `len` is larger than the payload bytes that follow it in the chain.
    #[error("header len {len} is larger than the {available} payload bytes in the chain")]
    LenBeyondChain {
        /// `len` from the header.
        len: u32,
        /// Payload bytes present.
        available: usize,
    },
    /// The header's `len` is beyond any legal packet size.
    #[error("header len {0} exceeds the 64 KiB packet limit")]
    LenTooLarge(u32),
}

/// `struct virtio_vsock_hdr`, decoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketHeader {
    /// Source context id.
    pub src_cid: u64,
    /// Destination context id.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Payload length.
    pub len: u32,
    /// Socket type (`VSOCK_TYPE_STREAM`).
    pub type_: u16,
    /// Operation (`VSOCK_OP_*`).
    pub op: u16,
    /// Operation flags (`VSOCK_SHUTDOWN_*` for `SHUTDOWN`).
    pub flags: u32,
    /// Sender's receive buffer size for this connection.
    pub buf_alloc: u32,
    /// Bytes the sender has consumed from its receive buffer so far (wrapping).
    pub fwd_cnt: u32,
}

impl PacketHeader {
    /// Encodes the header in wire format.
    pub fn to_bytes(&self) -> [u8; PKT_HEADER_SIZE] {
        let mut b = [0u8; PKT_HEADER_SIZE];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    /// Decodes a header from wire format.
    pub fn from_bytes(b: &[u8; PKT_HEADER_SIZE]) -> Self {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
        let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap_or([0; 2]));
        PacketHeader {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }

    /// Short name of the operation, for logs.
    pub fn op_name(&self) -> &'static str {
        match self.op {
            VSOCK_OP_REQUEST => "REQUEST",
            VSOCK_OP_RESPONSE => "RESPONSE",
            VSOCK_OP_RST => "RST",
            VSOCK_OP_SHUTDOWN => "SHUTDOWN",
            VSOCK_OP_RW => "RW",
            VSOCK_OP_CREDIT_UPDATE => "CREDIT_UPDATE",
            VSOCK_OP_CREDIT_REQUEST => "CREDIT_REQUEST",
            _ => "INVALID",
        }
    }
}

/// Outcome of moving bytes between a chain and a host stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamIo {
    /// Bytes moved.
    pub bytes: usize,
    /// The stream would block before the request was satisfied.
    pub would_block: bool,
    /// The stream reported end of file (reads only).
    pub eof: bool,
}

/// The guest buffers of one descriptor chain, all of one direction, all validated to lie inside
/// guest memory at the time the chain was parsed.
#[derive(Debug, Clone, Default)]
pub struct ChainBuffer {
    /// The descriptors' ranges: held inline for the chains guests post (Linux: one or two
    /// descriptors per packet), so that a packet costs no allocation.
    segments: SmallVec<[(GuestAddress, usize); INLINE_SEGMENTS]>,
    total: usize,
}

/// Descriptors a [`ChainBuffer`] holds without an allocation.
const INLINE_SEGMENTS: usize = 2;

impl ChainBuffer {
    /// Walks the chain at `head` and collects its buffers, refusing descriptors that are not
    /// `writable` (rx queue) or not readable (tx queue), that lie outside `mem`, or chains that
    /// do not end.
    pub fn from_head(head: ChainHead, mem: &GuestMem, writable: bool) -> Result<Self, ChainError> {
        let dir = |w: bool| if w { "writable" } else { "readable" };
        let mut segments = SmallVec::new();
        let mut total = 0usize;
        let mut count = 0usize;
        let mut terminated = false;
        let mut last: Option<&GuestRegion> = None;
        for desc in Descriptors::new(head, mem) {
            if count >= MAX_CHAIN_DESCRIPTORS {
                return Err(ChainError::Unterminated(MAX_CHAIN_DESCRIPTORS));
            }
            let index = count;
            count += 1;
            if desc.is_write_only() != writable {
                return Err(ChainError::WrongDirection {
                    index,
                    found: dir(desc.is_write_only()),
                    wanted: dir(writable),
                });
            }
            let len = desc.len() as usize;
            if len > 0 {
                if !in_memory(mem, &mut last, desc.addr().0, len) {
                    return Err(ChainError::OutsideMemory {
                        index,
                        addr: desc.addr().0,
                        len: desc.len(),
                    });
                }
                segments.push((desc.addr(), len));
                total += len;
            }
            terminated = !desc.has_next();
        }
        if count == 0 {
            return Err(ChainError::Empty);
        }
        if !terminated {
            // The walk stops silently after `queue_size` descriptors or at a `next` index outside
            // the table, as virtio-queue's does; the last descriptor still asking for a successor
            // tells us.
            return Err(ChainError::Unterminated(count));
        }
        Ok(ChainBuffer { segments, total })
    }

    /// Total bytes in the chain.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether the chain holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Visits the guest memory pieces covering `[offset, offset + len)`, splitting at descriptor
    /// and memory-region boundaries. `f` returns how many bytes of the piece it consumed; a short
    /// count stops the walk. Returns the total consumed.
    fn walk<F>(&self, mem: &GuestMem, offset: usize, len: usize, mut f: F) -> io::Result<usize>
    where
        F: FnMut(&mut vm_memory::VolatileSlice<'_, ()>) -> io::Result<usize>,
    {
        let mut done = 0usize;
        let ranges = self.segments.iter().map(|&(addr, len)| (addr.0, len));
        // Breaks with an error, or with `Ok` where `f` took fewer bytes than offered.
        let flow = for_each_slice_of_ranges(mem, ranges, offset, len, |_, slice| {
            let mut slice = match slice {
                Ok(slice) => slice,
                Err(e) => return ControlFlow::Break(Err(io::Error::other(e))),
            };
            let want = slice.len();
            match f(&mut slice) {
                Ok(got) => {
                    done += got;
                    if got < want {
                        ControlFlow::Break(Ok(()))
                    } else {
                        ControlFlow::Continue(())
                    }
                }
                Err(e) => ControlFlow::Break(Err(e)),
            }
        });
        match flow {
            ControlFlow::Break(Err(e)) => Err(e),
            ControlFlow::Break(Ok(())) | ControlFlow::Continue(()) => Ok(done),
        }
    }

    /// Copies `buf.len()` bytes from the chain at `offset` into `buf`; returns the bytes copied
    /// (fewer when the chain is shorter).
    pub fn read_at(&self, mem: &GuestMem, offset: usize, buf: &mut [u8]) -> io::Result<usize> {
        let mut pos = 0usize;
        self.walk(mem, offset, buf.len(), |s| {
            let n = s.copy_to(&mut buf[pos..pos + s.len()]);
            pos += n;
            Ok(n)
        })
    }

    /// Copies `data` to the start of the chain; returns the bytes copied. A packet header goes
    /// into the first descriptor of every chain Linux posts, and then costs one region check
    /// instead of [`ChainBuffer::write_at`]'s walk.
    pub fn write_start(&self, mem: &GuestMem, data: &[u8]) -> io::Result<usize> {
        if let Some(&(addr, len)) = self.segments.first()
            && len >= data.len()
            && let Some(written) = write_in_one_region(mem, addr.0, data)
        {
            written.map_err(io::Error::other)?;
            return Ok(data.len());
        }
        self.write_at(mem, 0, data)
    }

    /// Copies `data` into the chain at `offset`; returns the bytes copied.
    pub fn write_at(&self, mem: &GuestMem, offset: usize, data: &[u8]) -> io::Result<usize> {
        let mut pos = 0usize;
        self.walk(mem, offset, data.len(), |s| {
            let n = s.len();
            s.copy_from(&data[pos..pos + n]);
            pos += n;
            Ok(n)
        })
    }

    /// Appends `len` bytes of the chain at `offset` to `out`.
    pub fn append_to(
        &self,
        mem: &GuestMem,
        offset: usize,
        len: usize,
        out: &mut std::collections::VecDeque<u8>,
    ) -> io::Result<usize> {
        let mut tmp = [0u8; 4096];
        self.walk(mem, offset, len, |s| {
            let mut copied = 0;
            while copied < s.len() {
                let n = (s.len() - copied).min(tmp.len());
                let piece = s.subslice(copied, n).map_err(io::Error::other)?;
                piece.copy_to(&mut tmp[..n]);
                out.extend(&tmp[..n]);
                copied += n;
            }
            Ok(copied)
        })
    }

    /// Writes up to `len` bytes of the chain at `offset` to a nonblocking stream, stopping when the
    /// stream would block. Errors other than `WouldBlock` are returned.
    pub fn write_to_stream<W: WriteVolatile>(
        &self,
        mem: &GuestMem,
        offset: usize,
        len: usize,
        stream: &mut W,
    ) -> io::Result<StreamIo> {
        let mut would_block = false;
        let bytes = self.walk(mem, offset, len, |s| {
            let mut written = 0;
            while written < s.len() {
                let piece = s.offset(written).map_err(io::Error::other)?;
                match stream.write_volatile(&piece) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => written += n,
                    Err(e) => match volatile_io_kind(&e) {
                        Some(io::ErrorKind::WouldBlock) => {
                            would_block = true;
                            return Ok(written);
                        }
                        Some(io::ErrorKind::Interrupted) => continue,
                        _ => return Err(volatile_to_io(e)),
                    },
                }
            }
            Ok(written)
        })?;
        Ok(StreamIo {
            bytes,
            would_block,
            eof: false,
        })
    }

    /// Reads up to `max` bytes from a nonblocking stream into the chain at `offset`, stopping at
    /// end of file or when the stream would block.
    pub fn read_from_stream<R: ReadVolatile>(
        &self,
        mem: &GuestMem,
        offset: usize,
        max: usize,
        stream: &mut R,
    ) -> io::Result<StreamIo> {
        let mut would_block = false;
        let mut eof = false;
        let bytes = self.walk(mem, offset, max, |s| {
            let mut filled = 0;
            while filled < s.len() {
                let mut piece = s.offset(filled).map_err(io::Error::other)?;
                match stream.read_volatile(&mut piece) {
                    Ok(0) => {
                        eof = true;
                        return Ok(filled);
                    }
                    Ok(n) => filled += n,
                    Err(e) => match volatile_io_kind(&e) {
                        Some(io::ErrorKind::WouldBlock) => {
                            would_block = true;
                            return Ok(filled);
                        }
                        Some(io::ErrorKind::Interrupted) => continue,
                        _ => return Err(volatile_to_io(e)),
                    },
                }
            }
            Ok(filled)
        })?;
        Ok(StreamIo {
            bytes,
            would_block,
            eof,
        })
    }
}

fn volatile_io_kind(e: &VolatileMemoryError) -> Option<io::ErrorKind> {
    match e {
        VolatileMemoryError::IOError(io) => Some(io.kind()),
        _ => None,
    }
}

fn volatile_to_io(e: VolatileMemoryError) -> io::Error {
    match e {
        VolatileMemoryError::IOError(io) => io,
        other => io::Error::other(other),
    }
}

/// A packet the guest placed on the tx queue: its header and the chain holding its payload at
/// `[PKT_HEADER_SIZE, PKT_HEADER_SIZE + header.len)`.
#[derive(Debug, Clone)]
pub struct TxPacket {
    /// Decoded header.
    pub header: PacketHeader,
    /// The whole chain (header included).
    pub buffer: ChainBuffer,
}

impl TxPacket {
    /// Validates a tx chain: device-readable descriptors inside guest memory, a complete header,
    /// and a `len` that the chain really holds and that is within the packet limit.
    pub fn parse(head: ChainHead, mem: &GuestMem) -> Result<Self, ChainError> {
        let buffer = ChainBuffer::from_head(head, mem, false)?;
        if buffer.len() < PKT_HEADER_SIZE {
            return Err(ChainError::ShortHeader(buffer.len()));
        }
        let mut raw = [0u8; PKT_HEADER_SIZE];
        let n = buffer
            .read_at(mem, 0, &mut raw)
            .map_err(|_| ChainError::ShortHeader(0))?;
        if n < PKT_HEADER_SIZE {
            return Err(ChainError::ShortHeader(n));
        }
        let header = PacketHeader::from_bytes(&raw);
        if header.len > MAX_PKT_PAYLOAD {
            return Err(ChainError::LenTooLarge(header.len));
        }
        let available = buffer.len() - PKT_HEADER_SIZE;
        if header.len as usize > available {
            return Err(ChainError::LenBeyondChain {
                len: header.len,
                available,
            });
        }
        Ok(TxPacket { header, buffer })
    }
}

/// Validates an rx chain: device-writable descriptors inside guest memory with room for at least
/// one header.
pub fn parse_rx_chain(head: ChainHead, mem: &GuestMem) -> Result<ChainBuffer, ChainError> {
    let buffer = ChainBuffer::from_head(head, mem, true)?;
    if buffer.len() < PKT_HEADER_SIZE {
        return Err(ChainError::ShortHeader(buffer.len()));
    }
    Ok(buffer)
}

/// Chains built on a mock queue, as the device takes them.
#[cfg(test)]
pub(crate) mod mock {
    use super::{ChainHead, GuestMem};
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;

    /// Entries of the mock queues the tests build.
    pub(crate) const QUEUE_SIZE: u16 = 16;

    /// A queue of [`QUEUE_SIZE`] entries.
    pub(crate) fn queue(m: &GuestMem) -> MockSplitQueue<'_, GuestMem> {
        MockSplitQueue::new(m, QUEUE_SIZE)
    }

    /// `descs` linked in order, from index 0.
    pub(crate) fn chain(q: &MockSplitQueue<'_, GuestMem>, descs: &[RawDescriptor]) -> ChainHead {
        let c = q.build_desc_chain(descs).unwrap();
        head(q, c.head_index())
    }

    /// `descs` as written (their own `next` links), the chain starting at index 0.
    pub(crate) fn chains(q: &MockSplitQueue<'_, GuestMem>, descs: &[RawDescriptor]) -> ChainHead {
        let c = q.build_multiple_desc_chains(descs).unwrap();
        head(q, c.head_index())
    }

    fn head(q: &MockSplitQueue<'_, GuestMem>, index: u16) -> ChainHead {
        ChainHead {
            index,
            table: q.desc_table_addr(),
            queue_size: QUEUE_SIZE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{RawDescriptor, split::Descriptor as SplitDescriptor};
    use vm_memory::{Address, Bytes};

    const MEM_SIZE: usize = 0x40_0000;
    const HDR_ADDR: u64 = 0x10_0000;
    const DATA_ADDR: u64 = 0x20_0000;
    const WRITE: u16 = VRING_DESC_F_WRITE as u16;

    fn mem() -> GuestMem {
        GuestMem::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
    }

    fn desc(addr: u64, len: u32, flags: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
    }

    fn header(len: u32) -> PacketHeader {
        PacketHeader {
            src_cid: 3,
            dst_cid: VSOCK_HOST_CID,
            src_port: 1000,
            dst_port: 2000,
            len,
            type_: VSOCK_TYPE_STREAM,
            op: VSOCK_OP_RW,
            flags: 0,
            buf_alloc: 4096,
            fwd_cnt: 7,
        }
    }

    fn parse_tx(mem: &GuestMem, descs: &[RawDescriptor]) -> Result<TxPacket, ChainError> {
        let q = mock::queue(mem);
        TxPacket::parse(mock::chain(&q, descs), mem)
    }

    #[test]
    fn header_round_trips_in_wire_layout() {
        let h = header(5);
        let b = h.to_bytes();
        assert_eq!(&b[0..8], &3u64.to_le_bytes());
        assert_eq!(&b[24..28], &5u32.to_le_bytes());
        assert_eq!(&b[30..32], &VSOCK_OP_RW.to_le_bytes());
        assert_eq!(PacketHeader::from_bytes(&b), h);
    }

    #[test]
    fn tx_packet_with_separate_header_and_data_descriptors() {
        let m = mem();
        m.write_slice(&header(5).to_bytes(), GuestAddress(HDR_ADDR))
            .unwrap();
        m.write_slice(b"hello", GuestAddress(DATA_ADDR)).unwrap();
        let pkt = parse_tx(&m, &[desc(HDR_ADDR, 44, 0), desc(DATA_ADDR, 5, 0)]).unwrap();
        assert_eq!(pkt.header, header(5));
        let mut buf = [0u8; 5];
        assert_eq!(
            pkt.buffer.read_at(&m, PKT_HEADER_SIZE, &mut buf).unwrap(),
            5
        );
        assert_eq!(&buf, b"hello");
    }

    #[test]
    fn tx_packet_with_header_split_across_descriptors() {
        let m = mem();
        let raw = header(3).to_bytes();
        m.write_slice(&raw[..10], GuestAddress(HDR_ADDR)).unwrap();
        m.write_slice(&raw[10..], GuestAddress(DATA_ADDR)).unwrap();
        m.write_slice(b"abc", GuestAddress(DATA_ADDR + 34)).unwrap();
        let pkt = parse_tx(&m, &[desc(HDR_ADDR, 10, 0), desc(DATA_ADDR, 37, 0)]).unwrap();
        assert_eq!(pkt.header.len, 3);
        let mut buf = [0u8; 3];
        pkt.buffer.read_at(&m, PKT_HEADER_SIZE, &mut buf).unwrap();
        assert_eq!(&buf, b"abc");
    }

    #[test]
    fn tx_chain_with_writable_descriptor_is_refused() {
        let m = mem();
        m.write_slice(&header(0).to_bytes(), GuestAddress(HDR_ADDR))
            .unwrap();
        let err = parse_tx(&m, &[desc(HDR_ADDR, 44, WRITE)]).unwrap_err();
        assert!(
            matches!(err, ChainError::WrongDirection { index: 0, .. }),
            "{err}"
        );
        let err = parse_tx(&m, &[desc(HDR_ADDR, 44, 0), desc(DATA_ADDR, 8, WRITE)]).unwrap_err();
        assert!(
            matches!(err, ChainError::WrongDirection { index: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn tx_chain_outside_guest_memory_is_refused() {
        let m = mem();
        let err = parse_tx(&m, &[desc(MEM_SIZE as u64 - 8, 44, 0)]).unwrap_err();
        assert!(
            matches!(err, ChainError::OutsideMemory { index: 0, .. }),
            "{err}"
        );
        let err = parse_tx(&m, &[desc(u64::MAX - 10, 44, 0)]).unwrap_err();
        assert!(matches!(err, ChainError::OutsideMemory { .. }), "{err}");
        m.write_slice(&header(8).to_bytes(), GuestAddress(HDR_ADDR))
            .unwrap();
        let err = parse_tx(&m, &[desc(HDR_ADDR, 44, 0), desc(0x1_0000_0000, 8, 0)]).unwrap_err();
        assert!(
            matches!(err, ChainError::OutsideMemory { index: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn tx_header_shorter_than_44_bytes_is_refused() {
        let m = mem();
        let err = parse_tx(&m, &[desc(HDR_ADDR, 43, 0)]).unwrap_err();
        assert_eq!(err, ChainError::ShortHeader(43));
        let err = parse_tx(&m, &[desc(HDR_ADDR, 0, 0)]).unwrap_err();
        assert_eq!(err, ChainError::ShortHeader(0));
    }

    #[test]
    fn tx_len_beyond_chain_or_absurd_is_refused() {
        let m = mem();
        m.write_slice(&header(100).to_bytes(), GuestAddress(HDR_ADDR))
            .unwrap();
        let err = parse_tx(&m, &[desc(HDR_ADDR, 44, 0), desc(DATA_ADDR, 99, 0)]).unwrap_err();
        assert_eq!(
            err,
            ChainError::LenBeyondChain {
                len: 100,
                available: 99
            }
        );
        m.write_slice(&header(u32::MAX).to_bytes(), GuestAddress(HDR_ADDR))
            .unwrap();
        let err =
            parse_tx(&m, &[desc(HDR_ADDR, 44, 0), desc(DATA_ADDR, 0x10_0000, 0)]).unwrap_err();
        assert_eq!(err, ChainError::LenTooLarge(u32::MAX));
    }

    #[test]
    fn looping_chain_is_refused() {
        let m = mem();
        let q = mock::queue(&m);
        m.write_slice(&header(0).to_bytes(), GuestAddress(HDR_ADDR))
            .unwrap();
        // Two descriptors pointing at each other.
        let descs = [
            RawDescriptor::from(SplitDescriptor::new(
                HDR_ADDR,
                44,
                VRING_DESC_F_NEXT as u16,
                1,
            )),
            RawDescriptor::from(SplitDescriptor::new(
                DATA_ADDR,
                4,
                VRING_DESC_F_NEXT as u16,
                0,
            )),
        ];
        let chain = mock::chains(&q, &descs);
        let err = TxPacket::parse(chain, &m).unwrap_err();
        assert!(matches!(err, ChainError::Unterminated(16)), "{err}");
    }

    #[test]
    fn next_index_outside_table_is_refused() {
        let m = mem();
        let q = mock::queue(&m);
        m.write_slice(&header(0).to_bytes(), GuestAddress(HDR_ADDR))
            .unwrap();
        let descs = [RawDescriptor::from(SplitDescriptor::new(
            HDR_ADDR,
            44,
            VRING_DESC_F_NEXT as u16,
            999,
        ))];
        let chain = mock::chains(&q, &descs);
        let err = TxPacket::parse(chain, &m).unwrap_err();
        assert_eq!(err, ChainError::Unterminated(1));
    }

    #[test]
    fn rx_chain_must_be_writable_and_hold_a_header() {
        let m = mem();
        let q = mock::queue(&m);
        let chain = mock::chain(&q, &[desc(HDR_ADDR, 4096, WRITE)]);
        assert_eq!(parse_rx_chain(chain, &m).unwrap().len(), 4096);

        let chain = mock::chain(&q, &[desc(HDR_ADDR, 4096, 0)]);
        assert!(matches!(
            parse_rx_chain(chain, &m).unwrap_err(),
            ChainError::WrongDirection { .. }
        ));
        let chain = mock::chain(&q, &[desc(HDR_ADDR, 20, WRITE)]);
        assert_eq!(
            parse_rx_chain(chain, &m).unwrap_err(),
            ChainError::ShortHeader(20)
        );
    }

    #[test]
    fn indirect_chain_is_followed() {
        use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_INDIRECT;
        let m = mem();
        let q = mock::queue(&m);
        // Indirect table with a header descriptor chained to a data descriptor.
        let table = GuestAddress(0x30_0000);
        let entries = [
            RawDescriptor::from(SplitDescriptor::new(
                HDR_ADDR,
                44,
                VRING_DESC_F_NEXT as u16,
                1,
            )),
            RawDescriptor::from(SplitDescriptor::new(DATA_ADDR, 3, 0, 0)),
        ];
        for (i, e) in entries.iter().enumerate() {
            m.write_obj(*e, table.unchecked_add(16 * i as u64)).unwrap();
        }
        m.write_slice(&header(3).to_bytes(), GuestAddress(HDR_ADDR))
            .unwrap();
        m.write_slice(b"xyz", GuestAddress(DATA_ADDR)).unwrap();
        let head = RawDescriptor::from(SplitDescriptor::new(
            table.0,
            32,
            VRING_DESC_F_INDIRECT as u16,
            0,
        ));
        let chain = mock::chains(&q, &[head]);
        let pkt = TxPacket::parse(chain, &m).unwrap();
        let mut buf = [0u8; 3];
        pkt.buffer.read_at(&m, PKT_HEADER_SIZE, &mut buf).unwrap();
        assert_eq!(&buf, b"xyz");
    }

    #[test]
    fn stream_io_moves_bytes_across_segments() {
        let m = mem();
        let q = mock::queue(&m);
        let chain = mock::chain(
            &q,
            &[desc(HDR_ADDR, 50, WRITE), desc(DATA_ADDR, 100, WRITE)],
        );
        let rx = parse_rx_chain(chain, &m).unwrap();
        let (mut a, mut b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let payload: Vec<u8> = (0..80u8).collect();
        a.write_all(&payload).unwrap();
        let io = rx
            .read_from_stream(&m, PKT_HEADER_SIZE, 106, &mut b)
            .unwrap();
        assert_eq!(io.bytes, 80);
        assert!(io.would_block && !io.eof);
        let mut back = vec![0u8; 80];
        rx.read_at(&m, PKT_HEADER_SIZE, &mut back).unwrap();
        assert_eq!(back, payload);

        let io = rx.write_to_stream(&m, PKT_HEADER_SIZE, 80, &mut b).unwrap();
        assert_eq!(io.bytes, 80);
        let mut got = vec![0u8; 80];
        a.read_exact(&mut got).unwrap();
        assert_eq!(got, payload);

        drop(a);
        let io = rx
            .read_from_stream(&m, PKT_HEADER_SIZE, 10, &mut b)
            .unwrap();
        assert_eq!(
            io,
            StreamIo {
                bytes: 0,
                would_block: false,
                eof: true
            }
        );
    }

    #[test]
    fn ranges_across_memory_regions_are_read_and_written_in_place() {
        const HALF: u64 = MEM_SIZE as u64 / 2;
        let m = GuestMem::from_ranges(&[
            (GuestAddress(0), MEM_SIZE / 2),
            (GuestAddress(HALF), MEM_SIZE / 2),
        ])
        .unwrap();
        let q = mock::queue(&m);
        // In the first region, across the boundary, in the second: more descriptors than a
        // buffer holds inline.
        let ranges = [(0x1000, 100), (HALF - 30, 70), (HALF + 0x1000, 50)];
        let descs: Vec<_> = ranges
            .iter()
            .map(|&(addr, len)| desc(addr, len, WRITE))
            .collect();
        let rx = parse_rx_chain(mock::chain(&q, &descs), &m).unwrap();
        assert_eq!(rx.len(), 220);
        let data: Vec<u8> = (0..220u8).collect();
        assert_eq!(rx.write_at(&m, 0, &data).unwrap(), 220);
        let mut at = 0;
        for (addr, len) in ranges {
            let mut got = vec![0u8; len as usize];
            m.read_slice(&mut got, GuestAddress(addr)).unwrap();
            assert_eq!(got, data[at..at + len as usize], "the range at {addr:#x}");
            at += len as usize;
        }
        let mut back = vec![0u8; 150];
        assert_eq!(rx.read_at(&m, 60, &mut back).unwrap(), 150);
        assert_eq!(back, data[60..210]);
        // A range that runs past the end of memory is still refused.
        let q = mock::queue(&m);
        let past = mock::chain(&q, &[desc(MEM_SIZE as u64 - 10, 20, WRITE)]);
        assert!(matches!(
            parse_rx_chain(past, &m),
            Err(ChainError::OutsideMemory { .. })
        ));
    }
}
