//! The doorbell page: synchronous copies of pinned memory without the socket's round trip.
//!
//! On a unix socket a copy between a pinned buffer (`HostShare`) and device memory is one
//! `memcpy` in vgpud; at 1 MiB that takes about 20 µs here, and the request and reply frames
//! around it (two system calls and two socket wake-ups each way) about 4 µs more. A client that
//! made one of its shared regions its doorbell page ([`crate::msg::Doorbell`]) writes such a copy
//! there instead: the session thread, polling for its next frame, sees the request in the page,
//! serves it as it would the frame, and writes the completion back into the page, where the
//! client polls for it. Both directions cost a cache line's trip between two CPUs.
//!
//! Nobody waits on memory for long:
//!
//! - A session thread that stops polling says so in the page ([`Page::set_server_sleeping`])
//!   before it blocks on the socket, and looks at the page once more; a client that finds it
//!   asleep after ringing sends a [`crate::msg::Ring`] frame to wake it. (Each side writes its
//!   own word and then reads the other's, with sequentially consistent ordering: at least one
//!   of them sees the other.)
//! - A client that stops polling sets its waiting word and sleeps on the page's `done` word
//!   (a futex shared between the two processes); the session thread wakes it after completing.
//!
//! A client also keeps `sending` up to date, before each write on its socket: while it says
//! every byte was read, the polling session thread looks at the page alone and makes no
//! `recvmsg` (a system call per poll otherwise). A client that does not keep it only slows its
//! own frames: the session thread reads them once it stops polling and blocks on the socket.
//!
//! Order: the client sends every frame it has buffered before it rings and writes into the page
//! how many bytes it had sent on the socket by then; the session thread takes a rung request only
//! once it has read that many, so the request runs after every frame sent before it. (A client
//! that writes a wrong count only reorders its own requests.)
//!
//! The page is the client's memory, written by a hostile guest at any time: the session thread
//! copies the request out before it decodes it, serves only the two shared-copy requests, and
//! checks them as it checks frames; a torn or forged request is refused with an error in the
//! page, as its frame would have been.
//!
//! Layout (little-endian, each side's words on their own cache lines):
//!
//! | offset | size | written by | what |
//! |---|---|---|---|
//! | 0 | 4 | client | `seq`: the number of the request in the page (changes per request) |
//! | 4 | 2 | client | `opcode` of the request |
//! | 6 | 2 | client | `len`: bytes of its encoded fields |
//! | 8 | 8 | client | `sent`: bytes the client had sent on its socket when it rang |
//! | 16 | 48 | client | the encoded fields ([`REQUEST_MAX`]) |
//! | 64 | 4 | server | `done`: the `seq` of the last request served |
//! | 68 | 4 | server | `status`: its `CUresult` |
//! | 72 | 2 | server | `flags`: the reply frame's flags (`FLAG_OUTPUT`) |
//! | 76 | 4 | server | `message_len` |
//! | 128 | 4 | server | `server_sleeping`: 1 while the session thread blocks on the socket |
//! | 192 | 4 | client | `client_waiting`: 1 while the client sleeps on `done` |
//! | 200 | 8 | client | `sending`: bytes the client has sent or is sending on its socket |
//! | 256 | up to 3840 | server | the error message of a failed request ([`MESSAGE_MAX`]) |

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering, fence};
use std::time::Duration;

/// Bytes a doorbell page takes (a region of at least this many bytes).
pub const PAGE_BYTES: usize = 4096;
/// Largest encoded request the page holds.
pub const REQUEST_MAX: usize = 48;
/// Longest error message the page holds (longer ones are cut).
pub const MESSAGE_MAX: usize = PAGE_BYTES - MESSAGE;

const SEQ: usize = 0;
const OPCODE: usize = 4;
const LEN: usize = 6;
const SENT: usize = 8;
const REQUEST: usize = 16;
const DONE: usize = 64;
const STATUS: usize = 68;
const FLAGS: usize = 72;
const MESSAGE_LEN: usize = 76;
const SERVER_SLEEPING: usize = 128;
const CLIENT_WAITING: usize = 192;
const SENDING: usize = 200;
const MESSAGE: usize = 256;

/// A request as the session thread copied it out of the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rung {
    /// Its number (what [`Page::complete`] writes back).
    pub seq: u32,
    /// Its opcode.
    pub opcode: u16,
    /// Its encoded fields: the first `len` bytes (`len` at most [`REQUEST_MAX`]; a larger one
    /// declared is cut, and the request then fails to decode).
    pub fields: [u8; REQUEST_MAX],
    /// Bytes of `fields` used.
    pub len: usize,
}

impl Rung {
    /// The encoded fields.
    pub fn fields(&self) -> &[u8] {
        &self.fields[..self.len]
    }
}

/// A completion as the client read it from the page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The request's `CUresult`.
    pub status: u32,
    /// The flags its reply frame would have carried.
    pub flags: u16,
    /// Its error message (empty on success).
    pub message: String,
}

/// A doorbell page mapped in this process: [`PAGE_BYTES`] bytes of shared memory that the
/// other side may write at any time. Only atomics and byte copies touch it.
#[derive(Debug, Clone, Copy)]
pub struct Page {
    base: NonNull<u8>,
}

// SAFETY: the page is shared memory accessed only through atomics and byte copies; a `Page` is
// an address, valid for as long as its creator keeps the mapping (the contract of `new`).
unsafe impl Send for Page {}
// SAFETY: as above.
unsafe impl Sync for Page {}

impl Page {
    /// The page at `base`.
    ///
    /// # Safety
    ///
    /// `base` is the start of a live, writable mapping of at least [`PAGE_BYTES`] bytes,
    /// aligned to 64 bytes, that stays mapped for as long as this `Page` (or a copy) is used.
    pub unsafe fn new(base: NonNull<u8>) -> Self {
        Page { base }
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at + 4 <= PAGE_BYTES` at every call site and `at` is a multiple of 4 in a
        // 64-byte aligned page (the contract of `new`); the memory is shared, so only atomic
        // accesses are made through the reference.
        unsafe { &*self.base.as_ptr().wrapping_add(at).cast::<AtomicU32>() }
    }

    fn long(&self, at: usize) -> &AtomicU64 {
        // SAFETY: as in `word`, for eight bytes at a multiple of 8.
        unsafe { &*self.base.as_ptr().wrapping_add(at).cast::<AtomicU64>() }
    }

    fn half(&self, at: usize) -> &AtomicU16 {
        // SAFETY: as in `word`, for two bytes at an even offset.
        unsafe { &*self.base.as_ptr().wrapping_add(at).cast::<AtomicU16>() }
    }

    /// Copies `len` bytes at `at` out of the page (the other side may be writing them).
    fn read_bytes(&self, at: usize, out: &mut [u8]) {
        debug_assert!(at + out.len() <= PAGE_BYTES);
        for (i, b) in out.iter_mut().enumerate() {
            let p = self.base.as_ptr().wrapping_add(at + i);
            // SAFETY: the byte lies inside the page; a volatile read of shared memory into our
            // own buffer: a concurrent writer leaves some mix of bytes, never UB here.
            *b = unsafe { p.read_volatile() };
        }
    }

    fn write_bytes(&self, at: usize, bytes: &[u8]) {
        debug_assert!(at + bytes.len() <= PAGE_BYTES);
        for (i, b) in bytes.iter().enumerate() {
            let p = self.base.as_ptr().wrapping_add(at + i);
            // SAFETY: as in `read_bytes`, writing.
            unsafe { p.write_volatile(*b) };
        }
    }

    // The client's side.

    /// Writes a request and rings: returns its number. `sent`: the bytes sent on the socket so
    /// far. The previous request must be complete.
    pub fn ring(&self, opcode: u16, fields: &[u8], sent: u64) -> u32 {
        assert!(
            fields.len() <= REQUEST_MAX,
            "a doorbell request of {} bytes",
            fields.len()
        );
        self.write_bytes(REQUEST, fields);
        self.half(OPCODE).store(opcode, Ordering::Relaxed);
        self.half(LEN).store(fields.len() as u16, Ordering::Relaxed);
        self.long(SENT).store(sent, Ordering::Relaxed);
        let seq = self.word(SEQ).load(Ordering::Relaxed).wrapping_add(1);
        // SeqCst: ordered before the read of `server_sleeping` that follows (see the module).
        self.word(SEQ).store(seq, Ordering::SeqCst);
        seq
    }

    /// Says that the client has sent, or is about to send, `n` bytes on its socket in all.
    pub fn sending(&self, n: u64) {
        self.long(SENDING).store(n, Ordering::Release);
    }

    /// Whether the session thread said it blocks on the socket (read after [`Page::ring`]).
    pub fn server_sleeping(&self) -> bool {
        self.word(SERVER_SLEEPING).load(Ordering::SeqCst) != 0
    }

    /// Whether request `seq` is complete.
    pub fn is_done(&self, seq: u32) -> bool {
        self.word(DONE).load(Ordering::Acquire) == seq
    }

    /// Waits (sleeping) until request `seq` is complete or `timeout` passed; returns whether it
    /// is complete.
    pub fn wait_done(&self, seq: u32, timeout: Duration) -> bool {
        self.word(CLIENT_WAITING).store(1, Ordering::SeqCst);
        let done = self.word(DONE);
        let mut now = done.load(Ordering::SeqCst);
        if now != seq {
            futex_wait(done, now, timeout);
            now = done.load(Ordering::Acquire);
        }
        self.word(CLIENT_WAITING).store(0, Ordering::Relaxed);
        now == seq
    }

    /// The completion of the last request (after [`Page::is_done`]).
    pub fn completion(&self) -> Completion {
        let status = self.word(STATUS).load(Ordering::Relaxed);
        let flags = self.half(FLAGS).load(Ordering::Relaxed);
        let len = (self.word(MESSAGE_LEN).load(Ordering::Relaxed) as usize).min(MESSAGE_MAX);
        let mut message = vec![0u8; if status == 0 { 0 } else { len }];
        self.read_bytes(MESSAGE, &mut message);
        Completion {
            status,
            flags,
            message: String::from_utf8_lossy(&message).into_owned(),
        }
    }

    // The session thread's side.

    /// The request waiting, when its number is not `last` (the last one served).
    pub fn rung(&self, last: u32) -> Option<u32> {
        let seq = self.word(SEQ).load(Ordering::Acquire);
        (seq != last).then_some(seq)
    }

    /// The bytes the client says it has sent or is sending on its socket ([`Page::sending`]).
    pub fn sending_now(&self) -> u64 {
        self.long(SENDING).load(Ordering::Acquire)
    }

    /// The bytes the client said it had sent on the socket when it rang.
    pub fn sent(&self) -> u64 {
        self.long(SENT).load(Ordering::Relaxed)
    }

    /// The number of the request in the page now (served or not).
    pub fn seq(&self) -> u32 {
        self.word(SEQ).load(Ordering::Acquire)
    }

    /// Copies request `seq`'s opcode and fields out of the page.
    pub fn take(&self, seq: u32) -> Rung {
        let opcode = self.half(OPCODE).load(Ordering::Relaxed);
        let len = (self.half(LEN).load(Ordering::Relaxed) as usize).min(REQUEST_MAX);
        let mut fields = [0u8; REQUEST_MAX];
        self.read_bytes(REQUEST, &mut fields[..len]);
        Rung {
            seq,
            opcode,
            fields,
            len,
        }
    }

    /// Writes request `seq`'s completion and wakes the client if it sleeps.
    pub fn complete(&self, seq: u32, status: u32, flags: u16, message: &str) {
        let m = &message.as_bytes()[..message.len().min(MESSAGE_MAX)];
        if status != 0 {
            self.write_bytes(MESSAGE, m);
        }
        self.word(MESSAGE_LEN)
            .store(m.len() as u32, Ordering::Relaxed);
        self.half(FLAGS).store(flags, Ordering::Relaxed);
        self.word(STATUS).store(status, Ordering::Relaxed);
        // SeqCst: ordered before the read of `client_waiting` (the client stores that, then
        // reads `done`).
        self.word(DONE).store(seq, Ordering::SeqCst);
        if self.word(CLIENT_WAITING).load(Ordering::SeqCst) != 0 {
            futex_wake(self.word(DONE));
        }
    }

    /// Says whether the session thread blocks on its socket (`true` before it blocks, `false`
    /// once it woke).
    pub fn set_server_sleeping(&self, asleep: bool) {
        self.word(SERVER_SLEEPING)
            .store(u32::from(asleep), Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }
}

/// Sleeps while `word` holds `expected`, at most `timeout` (a futex shared between processes:
/// the page is a shared mapping).
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().try_into().unwrap_or(libc::time_t::MAX),
        tv_nsec: timeout.subsec_nanos().into(),
    };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call; the timespec is ours.
    // The result does not matter: the caller looks at the word again.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &raw const ts,
        )
    };
}

/// Wakes every sleeper on `word`.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32; FUTEX_WAKE only looks up waiters on it.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A page in a heap buffer (both sides in one process).
    struct Buf(Vec<u64>);

    impl Buf {
        fn new() -> Self {
            Buf(vec![0; PAGE_BYTES / 8])
        }

        fn page(&mut self) -> Page {
            // SAFETY: the buffer is PAGE_BYTES long, 8-byte aligned (enough: the words are at
            // multiples of 64 from its start), and outlives the test's use of the page.
            unsafe { Page::new(NonNull::new(self.0.as_mut_ptr().cast()).unwrap()) }
        }
    }

    #[test]
    fn a_request_rung_is_taken_and_its_completion_read_back() {
        let mut b = Buf::new();
        let p = b.page();
        assert_eq!(p.rung(0), None);
        let seq = p.ring(0x0842, &[1, 2, 3], 77);
        assert_eq!(p.rung(0), Some(seq));
        assert_eq!(p.sent(), 77);
        let r = p.take(seq);
        assert_eq!((r.opcode, r.fields()), (0x0842, &[1u8, 2, 3][..]));
        assert!(!p.is_done(seq));
        p.complete(seq, 1, 0x4, "bytes 0..+9 are outside the shared region");
        assert!(p.is_done(seq));
        assert_eq!(p.rung(seq), None);
        let c = p.completion();
        assert_eq!(c.status, 1);
        assert_eq!(c.flags, 0x4);
        assert_eq!(c.message, "bytes 0..+9 are outside the shared region");
        // A success carries no message, whatever the page held before.
        let seq = p.ring(0x0843, &[], 0);
        p.complete(seq, 0, 0, "");
        assert_eq!(p.completion().message, "");
    }

    #[test]
    fn declared_lengths_past_the_page_are_cut() {
        let mut b = Buf::new();
        let p = b.page();
        let seq = p.ring(1, &[7; REQUEST_MAX], 0);
        p.half(LEN).store(u16::MAX, Ordering::Relaxed);
        assert_eq!(p.take(seq).len, REQUEST_MAX);
        p.complete(seq, 2, 0, &"x".repeat(2 * PAGE_BYTES));
        p.word(MESSAGE_LEN).store(u32::MAX, Ordering::Relaxed);
        assert_eq!(p.completion().message.len(), MESSAGE_MAX);
    }

    #[test]
    fn a_sleeping_client_is_woken_by_the_completion() {
        let mut b = Buf::new();
        let p = b.page();
        let seq = p.ring(1, &[], 0);
        let done = Arc::new(std::sync::Barrier::new(2));
        let d2 = Arc::clone(&done);
        let server = std::thread::spawn(move || {
            d2.wait();
            std::thread::sleep(Duration::from_millis(20));
            p.complete(seq, 0, 0, "");
        });
        done.wait();
        let t = std::time::Instant::now();
        // Woken by the completion, long before the timeout.
        while !p.wait_done(seq, Duration::from_secs(30)) {}
        assert!(t.elapsed() < Duration::from_secs(20));
        server.join().unwrap();
        assert_eq!(p.word(CLIENT_WAITING).load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_server_sleeping_word_is_what_it_set() {
        let mut b = Buf::new();
        let p = b.page();
        assert!(!p.server_sleeping());
        p.set_server_sleeping(true);
        assert!(p.server_sleeping());
        p.set_server_sleeping(false);
        assert!(!p.server_sleeping());
    }
}
