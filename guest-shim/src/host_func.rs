//! Host functions: `cuLaunchHostFunc` and `cuStreamAddCallback`.
//!
//! The function runs in this process, on a thread of the shim
//! (`vgpu-hostfn`), when its stream reaches it; later work of the stream
//! waits until it has returned. The broker holds the stream at a gate named
//! by a 128-bit token (`StreamHostFunc`); the shim's thread asks when the
//! stream got there (`HostFuncWait`), runs the function and opens the gate
//! (`HostFuncDone`). That thread talks to vgpud over a connection of its
//! own, so it never waits for another thread's call on the process's
//! connection.
//!
//! Host functions of one stream run in order; those of different streams run
//! one at a time on the same thread, in the order their streams reach them.
//! A function whose context failed (a sticky error) before its stream got
//! there is not run. With a vgpud that predates host functions (or when the
//! second connection cannot be opened), the call waits for the stream and
//! runs the function on the calling thread, as earlier versions did.
//!
//! [`launch_host_func`] is the one entry point: graph host nodes reuse it.
//!
//! A graph's copies from and to host memory run on the same thread, at the
//! point their stream reaches them ([`launch_host_copy`], `StreamHostCopy`):
//! a copy to the device reads the host bytes then and sends them with the
//! gate's opening (`HostFuncDoneWrite`); a copy to the host gets the device
//! bytes, read when the stream got there, with the answer to its wait
//! (`HostFuncWaitRead`), and writes them to host memory before opening the
//! gate. So they see what the graph's earlier host nodes wrote, later host
//! nodes see what they copied, and `cuGraphLaunch` waits for none of them.

use std::cell::Cell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use vgpu_proto::cuda::{self, CuResult};
use vgpu_proto::msg;

use crate::client::{CallError, Client};
use crate::driver::{self as drv, CuRes};
use crate::transport;

/// `HostFuncWait` answer: not reached yet.
const PENDING: i32 = 0;
/// `HostFuncWait` answer: reached; run the function.
const REACHED: i32 = 1;
/// How long one `HostFuncWait` waits when only one stream has host
/// functions pending (the broker caps it).
const LONG_WAIT_MS: u32 = 200;
/// Pause between rounds of polls when several streams have host functions
/// pending and none was reached.
const POLL_PAUSE: Duration = Duration::from_millis(1);

/// A host function and its argument, as the application passed them.
pub(crate) enum HostCall {
    /// `cuLaunchHostFunc`.
    Func {
        /// The function.
        f: unsafe extern "C" fn(*mut c_void),
        /// Its argument.
        data: *mut c_void,
    },
    /// `cuStreamAddCallback`: also gets the stream and its status.
    Callback {
        /// The callback.
        f: unsafe extern "C" fn(*mut c_void, CuResult, *mut c_void),
        /// The stream as the application named it.
        stream: *mut c_void,
        /// Its argument.
        data: *mut c_void,
    },
}

// SAFETY: the pointers are the application's opaque arguments; the shim never
// dereferences them, it only passes them back to the application's function
// on another thread, which is what CUDA does with them too.
unsafe impl Send for HostCall {}

thread_local! {
    /// Set on the host-function thread while an application function runs.
    static IN_HOST_FUNC: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is running a host function (CUDA forbids CUDA
/// calls from there).
pub fn in_host_func() -> bool {
    IN_HOST_FUNC.with(Cell::get)
}

impl HostCall {
    /// Calls the function once.
    fn run(self, status: CuResult) {
        IN_HOST_FUNC.with(|c| c.set(true));
        match self {
            // SAFETY: the application's host function with its own argument,
            // called once, as CUDA does.
            HostCall::Func { f, data } => unsafe { f(data) },
            // SAFETY: the application's callback with its stream, the
            // stream's status and its own argument, called once.
            HostCall::Callback { f, stream, data } => unsafe { f(stream, status, data) },
        }
        IN_HOST_FUNC.with(|c| c.set(false));
    }
}

/// A graph's copy between host memory and the device, at most one bulk
/// chunk.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HostCopy {
    /// Host bytes at `src` to device address `dst`.
    ToDevice {
        /// Device destination.
        dst: u64,
        /// Host source address.
        src: usize,
        /// Bytes.
        len: usize,
    },
    /// Device bytes at `src` to host address `dst`.
    ToHost {
        /// Host destination address.
        dst: usize,
        /// Device source.
        src: u64,
        /// Bytes.
        len: usize,
    },
}

/// What the thread does when a stream reaches a gate.
enum Work {
    /// Runs a host function.
    Call(HostCall),
    /// Copies.
    Copy(HostCopy),
}

struct Pending {
    token: (u64, u64),
    stream: u64,
    work: Work,
}

struct Runner {
    queue: Mutex<VecDeque<Pending>>,
    cv: Condvar,
}

impl Runner {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Pending>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

static RUNNER: OnceLock<Option<Runner>> = OnceLock::new();

fn process_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Opens a connection of its own for a thread of the shim: host functions, synchronizing
/// calls ([`crate::sync_wait`]); `role` names it in vgpud's session list.
pub(crate) fn connect(role: &str) -> Result<Client, String> {
    let ep = transport::endpoint_from_env()?;
    let link = transport::open(&ep).map_err(|e| format!("cannot reach vgpud at {ep}: {e}"))?;
    let mut client = Client::with_link(link);
    client
        .hello(&format!("{} ({role})", process_name()))
        .map_err(|e| e.message)?;
    Ok(client)
}

/// The host-function thread, started on first use; `None` when its
/// connection cannot be opened.
fn runner() -> Option<&'static Runner> {
    RUNNER
        .get_or_init(|| {
            let client = match connect("host functions") {
                Ok(c) => c,
                Err(m) => {
                    crate::warn!(
                        "host functions run on the calling thread: no connection of their own ({m})"
                    );
                    return None;
                }
            };
            let spawned = std::thread::Builder::new()
                .name("vgpu-hostfn".into())
                .spawn(move || run_loop(client));
            match spawned {
                Ok(_) => Some(Runner {
                    queue: Mutex::new(VecDeque::new()),
                    cv: Condvar::new(),
                }),
                Err(e) => {
                    crate::warn!(
                        "cannot start the host-function thread ({e}); host functions run on the calling thread"
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// A token no other pending host function or synchronization of this VM has: random bits and
/// this process's id and counter.
pub(crate) fn new_token() -> (u64, u64) {
    static SEED: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let seed = *SEED.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    (
        seed ^ (u64::from(std::process::id()) << 32),
        NEXT.fetch_add(1, Ordering::Relaxed),
    )
}

/// Runs `call` when stream `stream` (of the current context) reaches this
/// point; later work of the stream waits for it to return.
pub(crate) fn launch_host_func(stream: u64, call: HostCall) -> CuRes<()> {
    let d = drv::driver()?;
    let ctx = drv::current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)?;
    let wire = drv::wire_stream(stream)?;
    let Some(r) = runner() else {
        return run_inline(stream, call);
    };
    let token = new_token();
    let sent = d.call(
        &msg::StreamHostFunc {
            ctx,
            stream: wire,
            token_hi: token.0,
            token_lo: token.1,
        },
        &[],
    );
    match sent {
        Ok(_) => {}
        // A vgpud without host functions.
        Err(cuda::CUDA_ERROR_NOT_SUPPORTED) => return run_inline(stream, call),
        Err(e) => return Err(e),
    }
    r.lock().push_back(Pending {
        token,
        stream: wire,
        work: Work::Call(call),
    });
    r.cv.notify_one();
    Ok(())
}

/// Copies `copy` when stream `stream` (of the current context) reaches this
/// point; later work of the stream waits for the copy. `Ok(false)`: this
/// vgpud (or a process without the host-function thread) cannot; the caller
/// copies otherwise.
///
/// The host memory of `copy` must stay valid until the stream has passed it,
/// as CUDA requires of a graph's memcpy nodes.
pub(crate) fn launch_host_copy(stream: u64, copy: HostCopy) -> CuRes<bool> {
    let d = drv::driver()?;
    let ctx = drv::current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)?;
    let wire = drv::wire_stream(stream)?;
    let Some(r) = runner() else {
        return Ok(false);
    };
    let (dev, len, to_device) = match copy {
        HostCopy::ToDevice { dst, len, .. } => (dst, len, 1),
        HostCopy::ToHost { src, len, .. } => (src, len, 0),
    };
    let token = new_token();
    let sent = d.call(
        &msg::StreamHostCopy {
            ctx,
            stream: wire,
            token_hi: token.0,
            token_lo: token.1,
            dev,
            len: len as u64,
            to_device,
        },
        &[],
    );
    match sent {
        Ok(_) => {}
        // A vgpud without host copies.
        Err(cuda::CUDA_ERROR_NOT_SUPPORTED) => return Ok(false),
        Err(e) => return Err(e),
    }
    r.lock().push_back(Pending {
        token,
        stream: wire,
        work: Work::Copy(copy),
    });
    r.cv.notify_one();
    Ok(true)
}

/// The fallback: waits for the stream, then runs the function here.
fn run_inline(stream: u64, call: HostCall) -> CuRes<()> {
    let status = match drv::stream_synchronize(stream) {
        Ok(()) => cuda::CUDA_SUCCESS,
        Err(e) if matches!(call, HostCall::Callback { .. }) => e,
        Err(e) => return Err(e),
    };
    call.run(status);
    Ok(())
}

fn wait(client: &mut Client, token: (u64, u64), timeout_ms: u32) -> Result<i32, CallError> {
    client
        .call(
            &msg::HostFuncWait {
                token_hi: token.0,
                token_lo: token.1,
                timeout_ms,
            },
            &[],
        )
        .map(|(r, _)| r.value)
}

fn wait_read(
    client: &mut Client,
    token: (u64, u64),
    timeout_ms: u32,
    bytes: &mut Vec<u8>,
) -> Result<i32, CallError> {
    let (r, tail) = client.call(
        &msg::HostFuncWaitRead {
            token_hi: token.0,
            token_lo: token.1,
            timeout_ms,
        },
        &[],
    )?;
    *bytes = tail;
    Ok(r.value)
}

fn done(client: &mut Client, token: (u64, u64)) -> Result<(), CallError> {
    client
        .call(
            &msg::HostFuncDone {
                token_hi: token.0,
                token_lo: token.1,
            },
            &[],
        )
        .map(drop)
}

/// A host copy whose stream reached it: copies (`bytes`: the device's, for a
/// copy to the host) and opens the gate.
fn run_copy(
    client: &mut Client,
    token: (u64, u64),
    copy: HostCopy,
    bytes: &[u8],
) -> Result<(), CallError> {
    match copy {
        HostCopy::ToDevice { src, len, .. } => {
            // SAFETY: the graph node's host source, which CUDA requires to stay valid and
            // readable for the copy's size until the graph's launch has passed it; read now, when
            // the graph's earlier nodes (host nodes included) have run.
            let data = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
            client
                .call(
                    &msg::HostFuncDoneWrite {
                        token_hi: token.0,
                        token_lo: token.1,
                    },
                    data,
                )
                .map(drop)
        }
        HostCopy::ToHost { dst, len, .. } => {
            if bytes.len() == len {
                // SAFETY: the graph node's host destination, which CUDA requires to stay valid
                // and writable for the copy's size until the launch has passed it; `bytes` holds
                // exactly `len` bytes and is not inside it.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, len) };
            } else {
                crate::warn!(
                    "a graph's device-to-host copy got {} bytes instead of {len}; not copied",
                    bytes.len()
                );
            }
            done(client, token)
        }
    }
}

fn run_loop(mut client: Client) {
    // The runner is published right after this thread starts.
    let r = loop {
        if let Some(Some(r)) = RUNNER.get() {
            break r;
        }
        std::thread::sleep(POLL_PAUSE);
    };
    loop {
        // The first pending function of each stream may be next.
        // (token, whether the wait brings device bytes)
        let candidates: Vec<((u64, u64), bool)> = {
            let mut q = r.lock();
            while q.is_empty() {
                q = r.cv.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            let mut seen = Vec::new();
            let mut c = Vec::new();
            for p in q.iter() {
                if !seen.contains(&p.stream) {
                    seen.push(p.stream);
                    c.push((
                        p.token,
                        matches!(p.work, Work::Copy(HostCopy::ToHost { .. })),
                    ));
                }
            }
            c
        };
        let timeout = if candidates.len() == 1 {
            LONG_WAIT_MS
        } else {
            0
        };
        let mut progressed = false;
        for (token, reads) in candidates {
            let mut bytes = Vec::new();
            let state = match reads {
                true => wait_read(&mut client, token, timeout, &mut bytes),
                false => wait(&mut client, token, timeout),
            };
            if matches!(state, Ok(PENDING)) {
                continue;
            }
            progressed = true;
            let Some(p) = ({
                let mut q = r.lock();
                q.iter()
                    .position(|p| p.token == token)
                    .and_then(|i| q.remove(i))
            }) else {
                continue;
            };
            match state {
                Ok(REACHED) => {
                    let done = match p.work {
                        Work::Call(call) => {
                            call.run(cuda::CUDA_SUCCESS);
                            done(&mut client, token)
                        }
                        Work::Copy(copy) => run_copy(&mut client, token, copy, &bytes),
                    };
                    if let Err(e) = done {
                        crate::warn!("host work done, but vgpud was not told: {}", e.message);
                    }
                }
                Ok(_) => {
                    crate::debug!("a host function was skipped: its context failed first");
                }
                Err(e) => {
                    crate::warn!("a host function cannot run: {}", e.message);
                }
            }
        }
        if !progressed && timeout == 0 {
            std::thread::sleep(POLL_PAUSE);
        }
    }
}
