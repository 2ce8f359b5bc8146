//! Streams as CUDA defines them, through the shim, vgpud and the simulated
//! GPU: order within a stream, event waits across streams, the legacy
//! default stream against blocking, non-blocking and per-thread streams,
//! kernels of different streams running at once, copies during kernels,
//! and host functions, and stream priorities on the execution units.
//!
//! Nothing here depends on timing: a `wait_flag` kernel spins until a flag
//! in device memory is set, so "still running" and "not started" are facts
//! until the test sets the flag (from another stream, which is itself what
//! some checks prove possible). A broken implementation fails with the
//! watchdog's `CUDA_ERROR_LAUNCH_TIMEOUT` or a wrong value, never a hang.
//! The priority checks wait for facts too (vgpud's admin API shows the
//! kernel workers waiting for an execution unit) and count the order in
//! which blocks end, allowing only for a kernel's tail.
// The test drives a C ABI with one uniform safety argument: every call passes
// valid pointers and sizes. Splitting it per call would only add noise.
#![allow(clippy::multiple_unsafe_ops_per_block)]

use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libloading::Library;
use vgpu_tests::conformance_streams::FLAG_PTX;
use vgpu_tests::harness::{TestVm, Vgpud, artifacts};

type R = c_int;
type H = *mut c_void;

const SUCCESS: R = 0;
const NOT_READY: R = 600;
const NON_BLOCKING: c_uint = 1;
/// The simulated device's execution units in this test (`workers`, the harness's default).
const WORKERS: c_uint = 2;
/// CUDA's greatest (highest) stream priority, as the shim reports it.
const GREATEST_PRIORITY: c_int = -5;
/// `hold(flag, started)`: each block counts itself in `*started`, then spins until `*flag != 0`.
/// `stamp(counter, out, work, gate)`: thread 0 of each block spins until `*gate != 0`, counts to
/// `work`, then takes the next ticket of `*counter` and writes it to `out[blockIdx.x]`: the order
/// in which blocks ended.
const PRIORITY_PTX: &str = "\
.version 7.0
.target sm_52
.address_size 64

.visible .entry hold(.param .u64 flag, .param .u64 started)
{
    .reg .pred %p<2>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [started];
    atom.global.add.u32 %r2, [%rd2], 1;
$Lspin:
    ld.volatile.global.u32 %r1, [%rd1];
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra $Lspin;
    ret;
}

.visible .entry stamp(.param .u64 counter, .param .u64 out, .param .u32 work, .param .u64 gate)
{
    .reg .pred %p<4>;
    .reg .b32 %r<7>;
    .reg .b64 %rd<6>;
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra $Ldone;
    ld.param.u64 %rd5, [gate];
$Lgate:
    ld.volatile.global.u32 %r6, [%rd5];
    setp.eq.u32 %p3, %r6, 0;
    @%p3 bra $Lgate;
    ld.param.u32 %r4, [work];
    mov.u32 %r5, 0;
$Lwork:
    setp.ge.u32 %p2, %r5, %r4;
    @%p2 bra $Lstamp;
    add.u32 %r5, %r5, 1;
    bra $Lwork;
$Lstamp:
    ld.param.u64 %rd1, [counter];
    ld.param.u64 %rd2, [out];
    atom.global.add.u32 %r2, [%rd1], 1;
    mov.u32 %r3, %ctaid.x;
    mul.wide.u32 %rd3, %r3, 4;
    add.u64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r2;
$Ldone:
    ret;
}
";
const LEGACY: H = 1 as H;
const PER_THREAD: H = 2 as H;

macro_rules! load {
    ($lib:expr, $name:literal: $($t:tt)*) => {{
        // SAFETY: the symbol is a driver function with this C signature.
        let s: libloading::Symbol<'_, unsafe extern "C" fn $($t)*> = unsafe { $lib.get($name.as_bytes()) }.unwrap();
        *s
    }};
}

type Launch = unsafe extern "C" fn(
    H,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    H,
    *mut *mut c_void,
    *mut *mut c_void,
) -> R;

/// The driver entry points the test uses.
struct Cu {
    ctx_set_current: unsafe extern "C" fn(H) -> R,
    stream_create: unsafe extern "C" fn(*mut H, c_uint) -> R,
    stream_create_prio: unsafe extern "C" fn(*mut H, c_uint, c_int) -> R,
    stream_get_priority: unsafe extern "C" fn(H, *mut c_int) -> R,
    stream_destroy: unsafe extern "C" fn(H) -> R,
    stream_sync: unsafe extern "C" fn(H) -> R,
    stream_query: unsafe extern "C" fn(H) -> R,
    stream_query_ptsz: unsafe extern "C" fn(H) -> R,
    stream_wait_event: unsafe extern "C" fn(H, H, c_uint) -> R,
    event_create: unsafe extern "C" fn(*mut H, c_uint) -> R,
    event_record: unsafe extern "C" fn(H, H) -> R,
    event_query: unsafe extern "C" fn(H) -> R,
    alloc: unsafe extern "C" fn(*mut u64, usize) -> R,
    memset_async: unsafe extern "C" fn(u64, c_uint, usize, H) -> R,
    dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> R,
    dtoh_async: unsafe extern "C" fn(*mut c_void, u64, usize, H) -> R,
    launch: Launch,
    launch_ptsz: Launch,
    host_func: unsafe extern "C" fn(H, unsafe extern "C" fn(*mut c_void), *mut c_void) -> R,
    add_callback:
        unsafe extern "C" fn(H, unsafe extern "C" fn(H, R, *mut c_void), *mut c_void, c_uint) -> R,
    wait_flag: H,
    set_flag: H,
    hold: H,
    stamp: H,
    ctx: H,
}

// SAFETY: the function pointers and handles are plain values the driver
// accepts from any thread.
unsafe impl Send for Cu {}
// SAFETY: as above.
unsafe impl Sync for Cu {}

impl Cu {
    fn alloc(&self, bytes: usize) -> u64 {
        let mut p = 0u64;
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { (self.alloc)(&mut p, bytes) }, SUCCESS);
        p
    }

    fn stream(&self, flags: c_uint) -> H {
        let mut s: H = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { (self.stream_create)(&mut s, flags) }, SUCCESS);
        s
    }

    fn event(&self) -> H {
        let mut e: H = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { (self.event_create)(&mut e, 0) }, SUCCESS);
        e
    }

    fn set(&self, p: u64, v: u32, s: H) {
        // SAFETY: p is a live allocation of at least 4 bytes.
        assert_eq!(unsafe { (self.memset_async)(p, v, 1, s) }, SUCCESS);
    }

    fn read(&self, p: u64) -> u32 {
        let mut v = 0u32;
        // SAFETY: 4 bytes into a u32.
        assert_eq!(unsafe { (self.dtoh)((&raw mut v).cast(), p, 4) }, SUCCESS);
        v
    }

    /// `wait_flag(flag, out)` on `s`: spins until `*flag != 0`, then writes
    /// `*flag + 1` to `out`.
    fn wait_on(&self, launch: Launch, s: H, flag: u64, out: u64) {
        let (mut a, mut b) = (flag, out);
        let mut params = [(&raw mut a).cast::<c_void>(), (&raw mut b).cast()];
        // SAFETY: the kernel takes two pointers; params points at them.
        let r = unsafe {
            launch(
                self.wait_flag,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, SUCCESS);
    }

    /// `set_flag(flag, value)` on `s`.
    fn set_by_kernel(&self, s: H, flag: u64, value: u32) {
        let (mut a, mut b) = (flag, value);
        let mut params = [(&raw mut a).cast::<c_void>(), (&raw mut b).cast()];
        // SAFETY: the kernel takes a pointer and a u32; params points at them.
        let r = unsafe {
            (self.launch)(
                self.set_flag,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, SUCCESS);
    }

    fn query(&self, s: H) -> R {
        // SAFETY: a stream handle of this process (or a special one).
        unsafe { (self.stream_query)(s) }
    }

    fn sync(&self, s: H) {
        // SAFETY: as above.
        assert_eq!(unsafe { (self.stream_sync)(s) }, SUCCESS);
    }
}

/// A plain integer as a host function's argument (never dereferenced).
fn tag(n: usize) -> *mut c_void {
    std::ptr::without_provenance_mut(n)
}

static LOG: Mutex<Vec<u64>> = Mutex::new(Vec::new());
static HOST_THREADS: Mutex<Vec<std::thread::ThreadId>> = Mutex::new(Vec::new());
static RELEASE: AtomicBool = AtomicBool::new(false);
static CALLBACK: Mutex<Option<(usize, R, usize)>> = Mutex::new(None);
static CALLS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn log_value(data: *mut c_void) {
    LOG.lock().unwrap().push(data.addr() as u64);
    HOST_THREADS
        .lock()
        .unwrap()
        .push(std::thread::current().id());
}

unsafe extern "C" fn block_until_released(_data: *mut c_void) {
    let t = Instant::now();
    while !RELEASE.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(1));
    }
    CALLS.fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn callback(stream: H, status: R, data: *mut c_void) {
    *CALLBACK.lock().unwrap() = Some((stream.addr(), status, data.addr()));
}

#[test]
fn streams_events_and_host_functions_follow_cuda() {
    // Two simulated workers; a watchdog turns a missing overlap into an error.
    let d = Vgpud::start_with(&[TestVm::new("vm", 64 << 20)], "watchdog_ms = 20000");
    // SAFETY: set before the shim reads it; this binary has a single test.
    unsafe { std::env::set_var("VGPU_TRANSPORT", d.transport("vm")) };
    // SAFETY: loading our own shim.
    let lib = unsafe { Library::new(artifacts().lib_dir.join("libcuda.so.1")) }.unwrap();
    let init = load!(lib, "cuInit": (c_uint) -> R);
    let ctx_create = load!(lib, "cuCtxCreate_v2": (*mut H, c_uint, c_int) -> R);
    let load_data = load!(lib, "cuModuleLoadData": (*mut H, *const c_void) -> R);
    let get_fn = load!(lib, "cuModuleGetFunction": (*mut H, H, *const c_char) -> R);
    let ptx = CString::new(FLAG_PTX).unwrap();
    let priority_ptx = CString::new(PRIORITY_PTX).unwrap();
    let (mut priority_module, mut hold, mut stamp): (H, H, H) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let mut ctx: H = std::ptr::null_mut();
    let (mut module, mut wait_flag, mut set_flag): (H, H, H) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: valid pointers throughout.
    unsafe {
        assert_eq!(init(0), SUCCESS);
        assert_eq!(ctx_create(&mut ctx, 0, 0), SUCCESS);
        assert_eq!(load_data(&mut module, ptx.as_ptr().cast()), SUCCESS);
        assert_eq!(
            get_fn(&mut wait_flag, module, c"wait_flag".as_ptr()),
            SUCCESS
        );
        assert_eq!(get_fn(&mut set_flag, module, c"set_flag".as_ptr()), SUCCESS);
        assert_eq!(
            load_data(&mut priority_module, priority_ptx.as_ptr().cast()),
            SUCCESS
        );
        assert_eq!(
            get_fn(&mut hold, priority_module, c"hold".as_ptr()),
            SUCCESS
        );
        assert_eq!(
            get_fn(&mut stamp, priority_module, c"stamp".as_ptr()),
            SUCCESS
        );
    }
    let cu = Arc::new(Cu {
        ctx_set_current: load!(lib, "cuCtxSetCurrent": (H) -> R),
        stream_create: load!(lib, "cuStreamCreate": (*mut H, c_uint) -> R),
        stream_create_prio: load!(lib, "cuStreamCreateWithPriority": (*mut H, c_uint, c_int) -> R),
        stream_get_priority: load!(lib, "cuStreamGetPriority": (H, *mut c_int) -> R),
        stream_destroy: load!(lib, "cuStreamDestroy_v2": (H) -> R),
        stream_sync: load!(lib, "cuStreamSynchronize": (H) -> R),
        stream_query: load!(lib, "cuStreamQuery": (H) -> R),
        stream_query_ptsz: load!(lib, "cuStreamQuery_ptsz": (H) -> R),
        stream_wait_event: load!(lib, "cuStreamWaitEvent": (H, H, c_uint) -> R),
        event_create: load!(lib, "cuEventCreate": (*mut H, c_uint) -> R),
        event_record: load!(lib, "cuEventRecord": (H, H) -> R),
        event_query: load!(lib, "cuEventQuery": (H) -> R),
        alloc: load!(lib, "cuMemAlloc_v2": (*mut u64, usize) -> R),
        memset_async: load!(lib, "cuMemsetD32Async": (u64, c_uint, usize, H) -> R),
        dtoh: load!(lib, "cuMemcpyDtoH_v2": (*mut c_void, u64, usize) -> R),
        dtoh_async: load!(lib, "cuMemcpyDtoHAsync_v2": (*mut c_void, u64, usize, H) -> R),
        launch: load!(lib, "cuLaunchKernel": (H, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, H, *mut *mut c_void, *mut *mut c_void) -> R),
        launch_ptsz: load!(lib, "cuLaunchKernel_ptsz": (H, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, H, *mut *mut c_void, *mut *mut c_void) -> R),
        host_func: load!(lib, "cuLaunchHostFunc": (H, unsafe extern "C" fn(*mut c_void), *mut c_void) -> R),
        add_callback: load!(lib, "cuStreamAddCallback": (H, unsafe extern "C" fn(H, R, *mut c_void), *mut c_void, c_uint) -> R),
        wait_flag,
        set_flag,
        hold,
        stamp,
        ctx,
    });

    kernels_of_two_streams_run_at_once(&cu);
    copies_and_queries_proceed_while_a_kernel_runs(&cu);
    event_waits_order_work_across_streams(&cu);
    the_legacy_stream_synchronizes_with_blocking_streams_only(&cu);
    per_thread_default_streams_are_per_thread(&cu);
    host_functions_run_in_stream_order_on_a_shim_thread(&cu);
    later_work_waits_for_a_host_function(&cu);
    stream_callbacks_get_their_stream_and_status(&cu);
    priorities_are_kept(&cu);
    a_higher_priority_streams_kernel_goes_first(&cu, &d);
    a_higher_priority_streams_kernel_overtakes_a_running_one(&cu, &d);
}

fn kernels_of_two_streams_run_at_once(cu: &Cu) {
    let (flag, out) = (cu.alloc(4), cu.alloc(4));
    let (s1, s2) = (cu.stream(NON_BLOCKING), cu.stream(NON_BLOCKING));
    cu.set(flag, 0, s1);
    cu.wait_on(cu.launch, s1, flag, out);
    // Only a kernel running at the same time can end the first one.
    cu.set_by_kernel(s2, flag, 41);
    cu.sync(s1);
    assert_eq!(cu.read(out), 42, "the waiting kernel saw the other's write");
    cu.sync(s2);
}

fn copies_and_queries_proceed_while_a_kernel_runs(cu: &Cu) {
    let (flag, out, other) = (cu.alloc(4), cu.alloc(4), cu.alloc(4));
    let (s1, s2) = (cu.stream(NON_BLOCKING), cu.stream(NON_BLOCKING));
    let ev = cu.event();
    cu.set(flag, 0, s1);
    cu.set(other, 7, s2);
    cu.wait_on(cu.launch, s1, flag, out);
    // SAFETY: handles of this process.
    assert_eq!(unsafe { (cu.event_record)(ev, s1) }, SUCCESS);
    // A copy on the other stream completes while the kernel still spins.
    let mut v = 0u32;
    // SAFETY: 4 bytes into a u32.
    let r = unsafe { (cu.dtoh_async)((&raw mut v).cast(), other, 4, s2) };
    assert_eq!(r, SUCCESS);
    cu.sync(s2);
    assert_eq!(v, 7);
    assert_eq!(cu.query(s1), NOT_READY, "the kernel waits for its flag");
    assert_eq!(cu.query(s2), SUCCESS);
    // SAFETY: an event of this process.
    assert_eq!(unsafe { (cu.event_query)(ev) }, NOT_READY);
    // A fill on the other stream releases it.
    cu.set(flag, 1, s2);
    cu.sync(s1);
    // SAFETY: as above.
    assert_eq!(unsafe { (cu.event_query)(ev) }, SUCCESS);
    assert_eq!(cu.read(out), 2);
}

fn event_waits_order_work_across_streams(cu: &Cu) {
    let (flag, out, x) = (cu.alloc(4), cu.alloc(4), cu.alloc(4));
    let (s1, s2, s3) = (
        cu.stream(NON_BLOCKING),
        cu.stream(NON_BLOCKING),
        cu.stream(NON_BLOCKING),
    );
    let ev = cu.event();
    cu.set(flag, 0, s1);
    cu.set(x, 1, s2);
    cu.sync(s2);
    cu.wait_on(cu.launch, s1, flag, out);
    // SAFETY: handles of this process.
    unsafe {
        assert_eq!((cu.event_record)(ev, s1), SUCCESS);
        assert_eq!((cu.stream_wait_event)(s2, ev, 0), SUCCESS);
    }
    cu.set(x, 5, s2);
    assert_eq!(cu.query(s2), NOT_READY, "s2 waits for the event on s1");
    // Re-recording the event later does not move s2's wait.
    cu.set(flag, 3, s3);
    cu.sync(s2);
    assert_eq!((cu.read(out), cu.read(x)), (4, 5));
}

fn the_legacy_stream_synchronizes_with_blocking_streams_only(cu: &Cu) {
    let (flag, out, y) = (cu.alloc(4), cu.alloc(4), cu.alloc(4));
    let blocking = cu.stream(0);
    let nonblocking = cu.stream(NON_BLOCKING);
    let releaser = cu.stream(NON_BLOCKING);

    // Legacy work waits for the blocking stream's earlier work.
    cu.set(flag, 0, releaser);
    cu.sync(releaser);
    cu.wait_on(cu.launch, blocking, flag, out);
    cu.set(y, 3, std::ptr::null_mut());
    assert_eq!(cu.query(std::ptr::null_mut()), NOT_READY);
    assert_eq!(
        cu.query(LEGACY),
        NOT_READY,
        "CU_STREAM_LEGACY is the same stream"
    );
    cu.set(flag, 1, releaser);
    cu.sync(std::ptr::null_mut());
    assert_eq!(cu.read(y), 3);

    // ... but not for a non-blocking stream's.
    cu.set(flag, 0, releaser);
    cu.sync(releaser);
    cu.wait_on(cu.launch, nonblocking, flag, out);
    cu.set(y, 4, std::ptr::null_mut());
    cu.sync(std::ptr::null_mut());
    assert_eq!(cu.read(y), 4);
    assert_eq!(cu.query(nonblocking), NOT_READY);
    // The legacy stream itself can release it.
    cu.set(flag, 1, std::ptr::null_mut());
    cu.sync(nonblocking);

    // A blocking stream's later work waits for earlier legacy work.
    cu.set(flag, 0, std::ptr::null_mut());
    cu.wait_on(cu.launch, std::ptr::null_mut(), flag, out);
    cu.set(y, 5, blocking);
    assert_eq!(cu.query(blocking), NOT_READY);
    cu.set(flag, 1, releaser);
    cu.sync(blocking);
    assert_eq!(cu.read(y), 5);
    // SAFETY: streams of this process.
    unsafe {
        for s in [blocking, nonblocking, releaser] {
            assert_eq!((cu.stream_destroy)(s), SUCCESS);
        }
    }
}

fn per_thread_default_streams_are_per_thread(cu: &Arc<Cu>) {
    let (flag, out, y) = (cu.alloc(4), cu.alloc(4), cu.alloc(4));
    let releaser = cu.stream(NON_BLOCKING);
    cu.set(flag, 0, releaser);
    cu.sync(releaser);
    let (c2, started) = (Arc::clone(cu), Arc::new(AtomicBool::new(false)));
    let s2 = Arc::clone(&started);
    let other = std::thread::spawn(move || {
        // SAFETY: the test's context.
        assert_eq!(unsafe { (c2.ctx_set_current)(c2.ctx) }, SUCCESS);
        // `_ptsz` with stream 0 is this thread's per-thread stream.
        c2.wait_on(c2.launch_ptsz, std::ptr::null_mut(), flag, out);
        assert_eq!(c2.query(PER_THREAD), NOT_READY);
        // SAFETY: as above.
        assert_eq!(
            // SAFETY: as the comment above the assertion says.
            unsafe { (c2.stream_query_ptsz)(std::ptr::null_mut()) },
            NOT_READY
        );
        s2.store(true, Ordering::Release);
        // The thread ends: its per-thread stream goes once its work is done.
    });
    other.join().unwrap();
    assert!(started.load(Ordering::Acquire));
    // This thread's per-thread stream is another one, and idle.
    assert_eq!(cu.query(PER_THREAD), SUCCESS);
    // SAFETY: as above.
    assert_eq!(
        // SAFETY: as the comment above the assertion says.
        unsafe { (cu.stream_query_ptsz)(std::ptr::null_mut()) },
        SUCCESS
    );
    // The legacy stream waits for per-thread streams (they are blocking).
    cu.set(y, 6, std::ptr::null_mut());
    assert_eq!(cu.query(std::ptr::null_mut()), NOT_READY);
    cu.set(flag, 1, releaser);
    cu.sync(std::ptr::null_mut());
    assert_eq!((cu.read(out), cu.read(y)), (2, 6));
}

fn host_functions_run_in_stream_order_on_a_shim_thread(cu: &Cu) {
    let (flag, out, w) = (cu.alloc(4), cu.alloc(4), cu.alloc(4));
    let (s1, releaser) = (cu.stream(NON_BLOCKING), cu.stream(NON_BLOCKING));
    LOG.lock().unwrap().clear();
    cu.set(flag, 0, s1);
    cu.wait_on(cu.launch, s1, flag, out);
    // SAFETY: host functions with plain integers as arguments.
    unsafe {
        assert_eq!((cu.host_func)(s1, log_value, tag(1)), SUCCESS);
        assert_eq!((cu.host_func)(s1, log_value, tag(2)), SUCCESS);
    }
    cu.set(w, 9, s1);
    // A host function on another stream is not held by s1.
    // SAFETY: as above.
    assert_eq!(
        // SAFETY: as the comment above the assertion says.
        unsafe { (cu.host_func)(releaser, log_value, tag(7)) },
        SUCCESS
    );
    cu.sync(releaser);
    assert_eq!(
        *LOG.lock().unwrap(),
        vec![7],
        "s1's functions wait for its kernel"
    );
    cu.set(flag, 1, releaser);
    cu.sync(s1);
    assert_eq!(*LOG.lock().unwrap(), vec![7, 1, 2]);
    assert_eq!(cu.read(w), 9);
    let main = std::thread::current().id();
    assert!(HOST_THREADS.lock().unwrap().iter().all(|t| *t != main));
}

fn later_work_waits_for_a_host_function(cu: &Cu) {
    let v = cu.alloc(4);
    let s1 = cu.stream(NON_BLOCKING);
    RELEASE.store(false, Ordering::Release);
    let before = CALLS.load(Ordering::SeqCst);
    // SAFETY: a host function that takes no argument.
    assert_eq!(
        // SAFETY: as the comment above the assertion says.
        unsafe { (cu.host_func)(s1, block_until_released, std::ptr::null_mut()) },
        SUCCESS
    );
    cu.set(v, 4, s1);
    assert_eq!(
        cu.query(s1),
        NOT_READY,
        "the fill waits for the host function"
    );
    let releaser = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(50));
        RELEASE.store(true, Ordering::Release);
    });
    // A synchronize while the host function runs does not keep it from
    // finishing (it has a connection of its own).
    cu.sync(s1);
    releaser.join().unwrap();
    assert_eq!(CALLS.load(Ordering::SeqCst), before + 1);
    assert_eq!(cu.read(v), 4);
}

fn stream_callbacks_get_their_stream_and_status(cu: &Cu) {
    let s1 = cu.stream(0);
    *CALLBACK.lock().unwrap() = None;
    // SAFETY: a callback with a plain integer argument.
    assert_eq!(
        // SAFETY: as the comment above the assertion says.
        unsafe { (cu.add_callback)(s1, callback, tag(0x5eed), 0) },
        SUCCESS
    );
    cu.sync(s1);
    assert_eq!(
        *CALLBACK.lock().unwrap(),
        Some((s1 as usize, SUCCESS, 0x5eed))
    );
    // Flags must be 0.
    // SAFETY: as above.
    assert_ne!(
        // SAFETY: as the comment above the assertion says.
        unsafe { (cu.add_callback)(s1, callback, std::ptr::null_mut(), 1) },
        SUCCESS
    );
}

fn priorities_are_kept(cu: &Cu) {
    let mut s: H = std::ptr::null_mut();
    let mut p: c_int = 0;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!((cu.stream_create_prio)(&mut s, NON_BLOCKING, -1), SUCCESS);
        assert_eq!((cu.stream_get_priority)(s, &mut p), SUCCESS);
    }
    assert_eq!(p, -1);
    cu.set(cu.alloc(4), 1, s);
    cu.sync(s);
}

/// Blocks of each `stamp` kernel of the priority tests.
const BLOCKS: c_uint = 32;
/// Loop iterations per block: a few milliseconds of interpretation.
const WORK: u32 = 20_000;

/// The simulated device's execution units as vgpud's admin API shows them: (busy, waiting).
fn units(d: &Vgpud) -> (u64, u64) {
    let (status, dev) = d.get("/v1/devices/gpu0");
    assert_eq!(status, 200, "{dev}");
    let u = &dev["execution_units"];
    assert_eq!(u["total"], WORKERS, "{dev}");
    (u["busy"].as_u64().unwrap(), u["waiting"].as_u64().unwrap())
}

/// Waits until `ok` holds for the device's (busy, waiting) execution units.
fn wait_units(d: &Vgpud, what: &str, ok: impl Fn((u64, u64)) -> bool) {
    let t = Instant::now();
    loop {
        let u = units(d);
        if ok(u) {
            return;
        }
        // Well within the watchdog, which would end the spinning kernels.
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{what}: execution units (busy, waiting) {u:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Launches `stamp` over [`BLOCKS`] blocks on `s` (see [`PRIORITY_PTX`]).
fn launch_stamp(cu: &Cu, s: H, counter: u64, out: u64, gate: u64) {
    let (mut c, mut o, mut w, mut g) = (counter, out, WORK, gate);
    let mut params = [
        (&raw mut c).cast::<c_void>(),
        (&raw mut o).cast(),
        (&raw mut w).cast(),
        (&raw mut g).cast(),
    ];
    // SAFETY: the kernel takes two pointers, a u32 and a pointer; params points at them.
    let r = unsafe {
        (cu.launch)(
            cu.stamp,
            BLOCKS,
            1,
            1,
            32,
            1,
            1,
            0,
            s,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(r, SUCCESS);
}

/// A low- and a high-priority stream, and buffers for their `stamp` kernels' tickets.
struct Contest {
    low: H,
    high: H,
    /// Another stream, for fills that need no execution unit.
    side: H,
    counter: u64,
    low_out: u64,
    high_out: u64,
    /// Always open (1).
    open: u64,
}

impl Contest {
    fn new(cu: &Cu) -> Self {
        let bytes = BLOCKS as usize * 4;
        let (mut low, mut high): (H, H) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!((cu.stream_create_prio)(&mut low, NON_BLOCKING, 0), SUCCESS);
            assert_eq!(
                (cu.stream_create_prio)(&mut high, NON_BLOCKING, GREATEST_PRIORITY),
                SUCCESS
            );
        }
        let c = Contest {
            low,
            high,
            side: cu.stream(NON_BLOCKING),
            counter: cu.alloc(4),
            low_out: cu.alloc(bytes),
            high_out: cu.alloc(bytes),
            open: cu.alloc(4),
        };
        cu.set(c.counter, 0, c.side);
        cu.set(c.open, 1, c.side);
        cu.sync(c.side);
        c
    }

    /// Waits for both kernels; checks every block ran once and that the high-priority kernel's
    /// blocks ran first: at most `limit` low-priority blocks ended before its last.
    fn check(self, cu: &Cu, limit: usize, why: &str) {
        for s in [self.side, self.low, self.high] {
            cu.sync(s);
        }
        let read = |p: u64| {
            let mut v = vec![0u32; BLOCKS as usize];
            // SAFETY: `BLOCKS` u32s into a vector of that size.
            let r = unsafe { (cu.dtoh)(v.as_mut_ptr().cast(), p, v.len() * 4) };
            assert_eq!(r, SUCCESS);
            v
        };
        let (lo, hi) = (read(self.low_out), read(self.high_out));
        let mut all: Vec<u32> = lo.iter().chain(&hi).copied().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..2 * BLOCKS).collect::<Vec<_>>(),
            "every block ran once"
        );
        let hi_last = hi.iter().max().unwrap();
        let low_before = lo.iter().filter(|&t| t < hi_last).count();
        assert!(
            low_before <= limit,
            "{why}: {low_before} low-priority blocks ended before the high-priority kernel's last (at most {limit}): low {lo:?}, high {hi:?}"
        );
        for s in [self.side, self.low, self.high] {
            // SAFETY: streams of this process.
            assert_eq!(unsafe { (cu.stream_destroy)(s) }, SUCCESS);
        }
    }
}

/// Among one VM's kernels waiting for the device's execution units, a higher-priority stream's
/// blocks go first, as a GPU's block scheduler prefers them: with every unit held by a spinning
/// kernel, a low-priority kernel queued first and a high-priority one queued second, the
/// high-priority kernel's blocks all end before the low-priority kernel's, but for a few at its
/// tail. (Without priorities the two share the units block by block.)
fn a_higher_priority_streams_kernel_goes_first(cu: &Cu, d: &Vgpud) {
    let c = Contest::new(cu);
    let (flag, started) = (cu.alloc(4), cu.alloc(4));
    for p in [flag, started] {
        cu.set(p, 0, c.side);
    }
    cu.sync(c.side);
    let hold = cu.stream(NON_BLOCKING);
    // One spinning block per execution unit; wait until both spin.
    let (mut f, mut st) = (flag, started);
    let mut params = [(&raw mut f).cast::<c_void>(), (&raw mut st).cast()];
    // SAFETY: the kernel takes two pointers; params points at them.
    let r = unsafe {
        (cu.launch)(
            cu.hold,
            WORKERS,
            1,
            1,
            1,
            1,
            1,
            0,
            hold,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(r, SUCCESS);
    let t = Instant::now();
    while cu.read(started) < WORKERS {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the holding blocks never ran"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    launch_stamp(cu, c.low, c.counter, c.low_out, c.open);
    launch_stamp(cu, c.high, c.counter, c.high_out, c.open);
    // Every worker of both kernels waits for a unit (each kernel has one per unit).
    wait_units(
        d,
        "both kernels never queued for the units",
        |(busy, waiting)| busy == u64::from(WORKERS) && waiting == 2 * u64::from(WORKERS),
    );
    // A fill needs no execution unit: it releases the spinning blocks.
    cu.set(flag, 1, c.side);
    cu.sync(hold);
    // SAFETY: a stream of this process.
    assert_eq!(unsafe { (cu.stream_destroy)(hold) }, SUCCESS);
    // The units the spinning blocks give back go to the high-priority kernel's workers; a
    // low-priority block starts only on a unit the high-priority kernel's last blocks leave
    // free (one per unit while its last block runs; a few more if that block's thread is kept
    // off the CPU). Sharing the units block by block would put about half of the
    // low-priority blocks before the last high one: 16 of these 32.
    c.check(cu, BLOCKS as usize / 4, "queued together");
}

/// A high-priority kernel that arrives while a low-priority one holds every execution unit takes
/// them from it between two blocks, every unit, not only the one its launch's own thread waits
/// for: the interpreter's pool gives each of its workers a thread even while the low-priority
/// kernel's workers hold the pool's others.
fn a_higher_priority_streams_kernel_overtakes_a_running_one(cu: &Cu, d: &Vgpud) {
    let c = Contest::new(cu);
    let gate = cu.alloc(4);
    cu.set(gate, 0, c.side);
    cu.sync(c.side);
    // The low-priority kernel's first blocks, one per unit, spin at the gate.
    launch_stamp(cu, c.low, c.counter, c.low_out, gate);
    wait_units(d, "the low-priority kernel never ran", |(busy, waiting)| {
        busy == u64::from(WORKERS) && waiting == 0
    });
    launch_stamp(cu, c.high, c.counter, c.high_out, c.open);
    wait_units(
        d,
        "the high-priority kernel's workers never all queued for the units",
        |(_, waiting)| waiting == u64::from(WORKERS),
    );
    cu.set(gate, 1, c.side);
    // The gated blocks end (one per unit), then every unit goes to the high-priority kernel
    // until its tail. Keeping one unit for the low-priority kernel would put about a third of
    // its blocks before the high-priority kernel's last.
    c.check(cu, WORKERS as usize + BLOCKS as usize / 8, "arriving later");
}
