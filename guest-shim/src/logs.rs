//! CUDA's error log (`cuLogs*`, CUDA 12.9): why calls failed, in words, for programs to read or
//! receive. vgpu has more to say than a `CUresult`: vgpud explains each refusal (the slice is
//! full, a pointer is another process's, a kernel touched memory it does not own), and the shim
//! says why it could not reach vgpud. Each failed driver call leaves one message with its
//! function, its result and vgpud's explanation, which registered callbacks also get; each shim
//! warning leaves one at warning level, for dumps.
//!
//! The messages are kept in a buffer of [`CAPACITY`] bytes (NVIDIA's size), the oldest dropped
//! first; an iterator is the sequence number of the next message, so a reader that fell behind
//! is told how many it lost. Results that are answers rather than failures (`CUDA_ERROR_NOT_READY`
//! from queries, `cuGetProcAddress` of a function that is not there) are not logged.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::{CString, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};

use vgpu_proto::cuda::{self, CuResult};

/// The most bytes of messages kept (NVIDIA's driver keeps 25600).
pub const CAPACITY: usize = 25_600;
/// The longest message kept; longer ones are cut (vgpud's messages are short).
pub const MESSAGE_MAX: usize = 1024;

/// `CUlogLevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Level {
    Error = 0,
    Warning = 1,
}

/// `CUlogsCallback`: `(userData, level, message, length)`.
pub type Callback = unsafe extern "C" fn(*mut c_void, u32, *mut std::ffi::c_char, usize);

#[derive(Debug)]
struct Entry {
    seq: u64,
    level: Level,
    text: String,
}

/// The buffer of messages and the registered callbacks.
#[derive(Default)]
struct Log {
    entries: VecDeque<Entry>,
    bytes: usize,
    /// The sequence number the next message gets (the low 32 bits are CUDA's iterator).
    next: u64,
    callbacks: Vec<(u64, Callback, usize)>,
    next_callback: u64,
}

/// What a dump wrote: the text and the iterator after it.
#[derive(Debug, PartialEq, Eq)]
pub struct Dump {
    pub text: String,
    pub next: u32,
}

impl Log {
    const fn new() -> Log {
        Log {
            entries: VecDeque::new(),
            bytes: 0,
            next: 0,
            callbacks: Vec::new(),
            next_callback: 1,
        }
    }

    /// Appends a message (cut to [`MESSAGE_MAX`]) and drops the oldest past [`CAPACITY`].
    fn push(&mut self, level: Level, mut text: String) -> String {
        if text.len() > MESSAGE_MAX {
            let mut cut = MESSAGE_MAX;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        self.bytes += text.len();
        self.entries.push_back(Entry {
            seq: self.next,
            level,
            text: text.clone(),
        });
        self.next += 1;
        while self.bytes > CAPACITY {
            match self.entries.pop_front() {
                Some(e) => self.bytes -= e.text.len(),
                None => break,
            }
        }
        text
    }

    /// The sequence number an iterator stands for: the latest one with its low 32 bits.
    fn seq_of(&self, it: u32) -> u64 {
        let back = u64::from((self.next as u32).wrapping_sub(it));
        self.next.saturating_sub(back)
    }

    /// The messages from iterator `from` (all with `None`), one per line, fitting in `room`
    /// bytes with a terminating NUL. Lost messages (dropped from the buffer, or left out for
    /// room) are announced on a first line; the most recent message is always included. `None`
    /// when not even it fits.
    fn dump(&self, from: Option<u32>, room: usize) -> Option<Dump> {
        let next = self.next as u32;
        let oldest = self.entries.front().map_or(self.next, |e| e.seq);
        let start = from.map_or(oldest, |it| self.seq_of(it));
        let dropped = oldest.saturating_sub(start);
        let lines: Vec<String> = self
            .entries
            .iter()
            .filter(|e| e.seq >= start)
            .map(|e| match e.level {
                Level::Error => format!("{}\n", e.text),
                Level::Warning => format!("warning: {}\n", e.text),
            })
            .collect();
        // All of them when they fit with nothing lost; otherwise the newest first while they
        // fit beside the note (sized for the most that can be lost).
        let all: usize = lines.iter().map(String::len).sum();
        let note_max = lost_note(lines.len() as u64 + dropped).len();
        let mut used = 1;
        let mut kept = 0;
        if dropped == 0 && all < room {
            kept = lines.len();
        }
        for l in lines.iter().rev().skip(kept) {
            let lost_if_last = (lines.len() - kept - 1) as u64 + dropped;
            let note = if lost_if_last > 0 { note_max } else { 0 };
            if used + l.len() + note > room {
                break;
            }
            used += l.len();
            kept += 1;
        }
        if kept == 0 && !lines.is_empty() {
            return None;
        }
        let lost = (lines.len() - kept) as u64 + dropped;
        let mut text = if lost > 0 {
            lost_note(lost)
        } else {
            String::new()
        };
        for l in &lines[lines.len() - kept..] {
            text.push_str(l);
        }
        if text.len() + 1 > room {
            return None;
        }
        Some(Dump { text, next })
    }
}

static LOG: Mutex<Log> = Mutex::new(Log::new());

fn log() -> MutexGuard<'static, Log> {
    LOG.lock().unwrap_or_else(PoisonError::into_inner)
}

thread_local! {
    /// vgpud's explanation of the calling thread's last failed request, for the message of the
    /// entry point that failed because of it.
    static HOST_MESSAGE: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Keeps vgpud's explanation of a failed request until the entry point returns.
pub fn note_host_message(message: &str) {
    if message.is_empty() {
        return;
    }
    let _ = HOST_MESSAGE.try_with(|m| *m.borrow_mut() = Some(message.to_string()));
}

fn take_host_message() -> Option<String> {
    HOST_MESSAGE
        .try_with(|m| m.borrow_mut().take())
        .ok()
        .flatten()
}

/// The text of a failed call's message.
fn failure_text(function: &str, code: CuResult, host: Option<String>) -> String {
    let name = cuda::result_name(code).unwrap_or("CUDA_ERROR_UNKNOWN");
    match host {
        Some(h) => format!("[{function}] {name} ({code}): {h}"),
        None => format!("[{function}] {name} ({code})"),
    }
}

/// An entry point returned `code`: a failure leaves a message (with vgpud's explanation when
/// there is one); a success forgets an explanation of a request that did not make it fail.
pub fn returned(function: &str, code: CuResult) {
    let host = take_host_message();
    if code != cuda::CUDA_SUCCESS && is_failure(function, code) {
        record(Level::Error, failure_text(function, code, host));
    }
}

/// Whether `code` from `function` is a failure worth a message (not an answer).
fn is_failure(function: &str, code: CuResult) -> bool {
    match code {
        cuda::CUDA_ERROR_NOT_READY => false,
        cuda::CUDA_ERROR_NOT_FOUND => !function.starts_with("cuGetProcAddress"),
        _ => true,
    }
}

/// A shim warning (also printed on stderr unless `VGPU_LOG=off`): kept for dumps, not handed to
/// the callbacks, since the shim may warn while it holds its own locks and a callback may call
/// CUDA.
pub fn warning(text: String) {
    log().push(Level::Warning, format!("[vgpu] {text}"));
}

/// Appends a message and hands it to the callbacks (outside the log's lock: a callback may read
/// the log). Called where the shim holds no lock of its own: as an entry point returns.
pub fn record(level: Level, text: String) {
    let (text, callbacks) = {
        let mut l = log();
        let text = l.push(level, text);
        (text, l.callbacks.clone())
    };
    if callbacks.is_empty() {
        return;
    }
    let len = text.len();
    let Ok(c) = CString::new(text.replace('\0', " ")) else {
        return;
    };
    let raw = c.into_raw();
    for (_, f, data) in callbacks {
        // SAFETY: `f` was registered through cuLogsRegisterCallback, whose contract makes it a
        // function of this signature valid while registered; `raw` is a NUL-terminated buffer
        // of `len` bytes that lives until after the calls; `data` is the caller's pointer,
        // passed back untouched.
        unsafe { f(data as *mut c_void, level as u32, raw, len) };
    }
    // SAFETY: `raw` came from `CString::into_raw` above and is reclaimed once.
    drop(unsafe { CString::from_raw(raw) });
}

/// `cuLogsRegisterCallback`: the handle.
pub fn register(f: Callback, data: usize) -> u64 {
    let mut l = log();
    let id = l.next_callback;
    l.next_callback += 1;
    l.callbacks.push((id, f, data));
    id
}

/// `cuLogsUnregisterCallback`: false for a handle that is not registered.
pub fn unregister(id: u64) -> bool {
    let mut l = log();
    let before = l.callbacks.len();
    l.callbacks.retain(|(i, _, _)| *i != id);
    l.callbacks.len() != before
}

/// `cuLogsCurrent`: the iterator of the next message.
pub fn current() -> u32 {
    log().next as u32
}

/// `cuLogsDumpToMemory` and `cuLogsDumpToFile`: see [`Log::dump`].
pub fn dump(from: Option<u32>, room: usize) -> Option<Dump> {
    log().dump(from, room)
}

fn lost_note(n: u64) -> String {
    format!("[vgpu] {n} earlier log messages were dropped (the log keeps {CAPACITY} bytes)\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_read_with_vgpuds_reason_and_answers_are_not_failures() {
        assert_eq!(
            failure_text(
                "cuMemAlloc_v2",
                cuda::CUDA_ERROR_OUT_OF_MEMORY,
                Some("96 MiB more than the VM's slice of 64 MiB".into())
            ),
            "[cuMemAlloc_v2] CUDA_ERROR_OUT_OF_MEMORY (2): 96 MiB more than the VM's slice of 64 MiB"
        );
        assert_eq!(
            failure_text("cuMemFree_v2", cuda::CUDA_ERROR_INVALID_VALUE, None),
            "[cuMemFree_v2] CUDA_ERROR_INVALID_VALUE (1)"
        );
        assert!(!is_failure("cuStreamQuery", cuda::CUDA_ERROR_NOT_READY));
        assert!(!is_failure(
            "cuGetProcAddress_v2",
            cuda::CUDA_ERROR_NOT_FOUND
        ));
        assert!(is_failure(
            "cuModuleGetFunction",
            cuda::CUDA_ERROR_NOT_FOUND
        ));
        assert!(is_failure("cuMemAlloc_v2", cuda::CUDA_ERROR_OUT_OF_MEMORY));
    }

    #[test]
    fn dumps_follow_the_iterator_and_report_nothing_new_as_empty() {
        let mut l = Log::new();
        l.push(Level::Error, "one".into());
        let it = l.next as u32;
        l.push(Level::Warning, "two".into());
        l.push(Level::Error, "three".into());
        let d = l.dump(Some(it), usize::MAX).unwrap();
        assert_eq!(d.text, "warning: two\nthree\n");
        assert_eq!(d.next, 3);
        assert_eq!(l.dump(Some(d.next), usize::MAX).unwrap().text, "");
        assert_eq!(
            l.dump(None, usize::MAX).unwrap().text,
            "one\nwarning: two\nthree\n"
        );
    }

    #[test]
    fn a_small_buffer_gets_the_newest_messages_and_a_note_of_the_rest() {
        let mut l = Log::new();
        let msg = |i: usize| format!("message {i} {}", "y".repeat(60));
        for i in 0..5 {
            l.push(Level::Error, msg(i));
        }
        let line = |i: usize| format!("{}\n", msg(i));
        let d = l
            .dump(None, lost_note(4).len() + line(4).len() + 1)
            .unwrap();
        assert_eq!(d.text, format!("{}{}", lost_note(4), line(4)));
        let d = l
            .dump(None, lost_note(3).len() + 2 * line(4).len() + 1)
            .unwrap();
        assert_eq!(d.text, format!("{}{}{}", lost_note(3), line(3), line(4)));
        assert_eq!(
            l.dump(None, line(4).len()),
            None,
            "not even the newest fits"
        );
        let exact: String = (0..5).map(line).collect();
        assert_eq!(l.dump(None, exact.len() + 1).unwrap().text, exact);
        let d = l.dump(None, exact.len()).unwrap();
        assert!(
            d.text.starts_with("[vgpu] ") && d.text.ends_with(&line(4)),
            "{}",
            d.text
        );
    }

    #[test]
    fn the_buffer_keeps_its_capacity_and_says_what_it_dropped() {
        let mut l = Log::new();
        let it = l.next as u32;
        let big = "x".repeat(MESSAGE_MAX + 100);
        let n = CAPACITY / MESSAGE_MAX + 5;
        for _ in 0..n {
            l.push(Level::Warning, big.clone());
        }
        assert!(l.bytes <= CAPACITY);
        let kept = l.entries.len();
        assert_eq!(kept, CAPACITY / MESSAGE_MAX);
        let d = l.dump(Some(it), usize::MAX).unwrap();
        assert!(
            d.text.starts_with(&lost_note((n - kept) as u64)),
            "{}",
            &d.text[..100]
        );
        assert_eq!(d.text.lines().count(), kept + 1);
        assert!(d.text.lines().nth(1).unwrap().starts_with("warning: xxx"));
        assert_eq!(
            d.text.lines().nth(1).unwrap().len(),
            "warning: ".len() + MESSAGE_MAX
        );
    }

    #[test]
    fn iterators_are_the_low_bits_of_the_sequence() {
        let mut l = Log::new();
        l.next = (1 << 32) + 5;
        assert_eq!(l.seq_of(3), (1 << 32) + 3);
        assert_eq!(l.seq_of(5), (1 << 32) + 5);
        assert_eq!(l.seq_of(7), 7, "an iterator ahead of the log wraps back");
    }

    /// Messages of the callback test the callback got: errors, warnings.
    static ERRORS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    static WARNINGS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    unsafe extern "C" fn count(
        _data: *mut c_void,
        level: u32,
        message: *mut std::ffi::c_char,
        len: usize,
    ) {
        // SAFETY: `message` is NUL-terminated and `len` long (the log's contract).
        let text = unsafe { std::ffi::CStr::from_ptr(message) }.to_bytes();
        let ours = text.starts_with(b"callback-test") || text.starts_with(b"[vgpu] callback-test");
        if ours && text.len() == len {
            let n = if level == Level::Error as u32 {
                &ERRORS
            } else {
                &WARNINGS
            };
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn callbacks_get_each_failure_until_unregistered_and_no_warnings() {
        let h = register(count, 0);
        record(Level::Error, "callback-test one".into());
        warning("callback-test: a warning is for dumps only".into());
        record(Level::Error, "callback-test two".into());
        assert!(unregister(h));
        assert!(!unregister(h), "only once");
        record(Level::Error, "callback-test three".into());
        assert_eq!(ERRORS.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert_eq!(WARNINGS.load(std::sync::atomic::Ordering::Relaxed), 0);
        let d = dump(None, usize::MAX).unwrap();
        assert!(
            d.text
                .contains("warning: [vgpu] callback-test: a warning is for dumps only")
        );
    }
}
