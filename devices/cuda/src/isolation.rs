//! Whether virtual memory management (VMM) mappings stay in the CUDA context that made them
//! (docs/memory.md, "VMM isolation probe").
//!
//! vgpud runs every VM in its own CUDA context inside one process, and relies on contexts
//! having separate GPU address spaces. `cuMemSetAccess` grants access to a *device*, not to a
//! context, and address reservations belong to the process, so a mapping made for one VM might
//! be reachable by another VM's kernel on the same GPU. Nothing in the driver documentation
//! settles it, so each device is probed when it is opened:
//!
//! 1. two probe contexts, A and B, are created on the device;
//! 2. in A, one granule of `cuMemCreate` memory is mapped read-write in a reserved range and
//!    filled with [`PATTERN`];
//! 3. in B, a hand-written kernel ([`PROBE_PTX`]) loads a word from A's address and stores it
//!    into a `cuMemAlloc` buffer of B, which was filled with [`SENTINEL`] first.
//!
//! B's kernel faulting (`CUDA_ERROR_ILLEGAL_ADDRESS` and the like, at the synchronisation)
//! proves the mapping private to A: [`VmmIsolation::Isolated`]. B reading [`PATTERN`] proves
//! it shared: [`VmmIsolation::Shared`]. Anything else, including a probe that could not be set
//! up, is [`VmmIsolation::Unknown`]. Only `Isolated` lets the device make movable allocations
//! and serve guests' `cuMemCreate`.
//!
//! The driver calls go through [`ProbeOps`], so the sequence, the verdict and the cleanup
//! order are unit-tested without a GPU.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use vgpu_proto::cuda::{self, CuResult};

use crate::driver::{Ctx, Driver, Event, Failed, Function, MemPlace, Module, Stream};

/// The word context A writes into its VMM memory.
pub const PATTERN: u32 = 0x5647_5055;
/// The word B's buffer holds before its kernel runs (distinct from [`PATTERN`]).
pub const SENTINEL: u32 = 0xdead_beef;
/// Name of the probe kernel in [`PROBE_PTX`].
pub const PROBE_KERNEL: &str = "vgpu_vmm_probe";
/// `vgpu_vmm_probe(src, dst)`: `*dst = *src` for one 32-bit word (NUL-terminated, as
/// `cuModuleLoadDataEx` takes PTX).
pub const PROBE_PTX: &str = ".version 7.0\n.target sm_50\n.address_size 64\n\n\
.visible .entry vgpu_vmm_probe(.param .u64 src, .param .u64 dst)\n{\n\
\t.reg .b32 %r<2>;\n\t.reg .b64 %rd<5>;\n\
\tld.param.u64 %rd1, [src];\n\tld.param.u64 %rd2, [dst];\n\
\tcvta.to.global.u64 %rd3, %rd1;\n\tcvta.to.global.u64 %rd4, %rd2;\n\
\tld.global.u32 %r1, [%rd3];\n\tst.global.u32 [%rd4], %r1;\n\tret;\n}\n\0";
/// How long the probe waits for its fill, kernel or read-back to complete.
pub const PROBE_WAIT: Duration = Duration::from_secs(10);
/// Bytes of B's destination buffer (one word).
const WORD: u64 = 4;
/// `CU_EVENT_DISABLE_TIMING`.
const EVENT_DISABLE_TIMING: u32 = 2;
/// Pause between polls of the probe's event.
const POLL: Duration = Duration::from_micros(100);

/// What the probe found out about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmmIsolation {
    /// Another context's kernel faults on a VMM mapping: mappings are private to their context.
    Isolated,
    /// Another context's kernel read the mapping: VMM memory of one VM is reachable by others.
    Shared,
    /// The probe could not tell (no VMM, a setup call failed, an unexpected result); treated
    /// like [`VmmIsolation::Shared`].
    Unknown(String),
}

impl VmmIsolation {
    /// Whether VMM mappings are proven private to their context.
    pub fn proven(&self) -> bool {
        matches!(self, VmmIsolation::Isolated)
    }

    /// `isolated`, `shared` or `unknown` (for logs and reports).
    pub fn as_str(&self) -> &'static str {
        match self {
            VmmIsolation::Isolated => "isolated",
            VmmIsolation::Shared => "shared",
            VmmIsolation::Unknown(_) => "unknown",
        }
    }

    /// Why guests' `cuMemCreate` and movable allocations are off on this device; `None` when
    /// isolation is proven.
    pub fn refusal(&self) -> Option<String> {
        match self {
            VmmIsolation::Isolated => None,
            VmmIsolation::Shared => Some(
                "virtual memory management is off on this GPU: vgpud's isolation probe saw \
                 another CUDA context's kernel read a cuMemCreate mapping, so one VM's VMM \
                 memory would be reachable by other VMs"
                    .into(),
            ),
            VmmIsolation::Unknown(why) => Some(format!(
                "virtual memory management is off on this GPU: vgpud's isolation probe could \
                 not prove that cuMemCreate mappings stay private to their VM ({why})"
            )),
        }
    }
}

impl fmt::Display for VmmIsolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VmmIsolation::Unknown(why) => write!(f, "unknown ({why})"),
            v => f.write_str(v.as_str()),
        }
    }
}

/// The driver calls the probe makes, on one device. Contexts are pushed and popped
/// explicitly: the probe leaves the calling thread's context stack as it found it.
pub(crate) trait ProbeOps {
    /// Minimum granularity of device memory for `cuMemCreate`.
    fn granularity(&self) -> Result<u64, Failed>;
    /// `cuCtxCreate` then `cuCtxPopCurrent`: a new context, not current.
    fn ctx_create(&self) -> Result<Ctx, Failed>;
    /// `cuCtxDestroy` of a context that is not current.
    fn ctx_destroy(&self, c: Ctx) -> Result<(), Failed>;
    /// `cuCtxPushCurrent`.
    fn ctx_push(&self, c: Ctx) -> Result<(), Failed>;
    /// `cuCtxPopCurrent`.
    fn ctx_pop(&self) -> Result<(), Failed>;
    /// `cuMemAddressReserve`.
    fn reserve(&self, size: u64, align: u64) -> Result<u64, Failed>;
    /// `cuMemAddressFree`.
    fn unreserve(&self, va: u64, size: u64) -> Result<(), Failed>;
    /// `cuMemCreate` of device memory.
    fn create(&self, size: u64) -> Result<u64, Failed>;
    /// `cuMemRelease`.
    fn release(&self, handle: u64) -> Result<(), Failed>;
    /// `cuMemMap` and `cuMemSetAccess` (read-write for the device).
    fn map(&self, va: u64, size: u64, handle: u64) -> Result<(), Failed>;
    /// `cuMemUnmap`.
    fn unmap(&self, va: u64, size: u64) -> Result<(), Failed>;
    /// `cuMemAlloc` in the current context.
    fn alloc(&self, size: u64) -> Result<u64, Failed>;
    /// `cuMemsetD32Async` of `count` words on the current context's default stream.
    fn fill(&self, dst: u64, value: u32, count: u64) -> Result<(), Failed>;
    /// `cuModuleLoadDataEx` of PTX in the current context.
    fn load(&self, ptx: &str) -> Result<Module, Failed>;
    /// `cuModuleGetFunction`.
    fn function(&self, m: Module, name: &str) -> Result<Function, Failed>;
    /// `cuLaunchKernel` of one thread on the default stream with a packed parameter buffer.
    fn launch(&self, f: Function, params: &[u8]) -> Result<(), Failed>;
    /// Waits for the current context's default stream (event record and poll, at most
    /// [`PROBE_WAIT`]); the first error of its work is the result.
    fn sync(&self) -> Result<(), Failed>;
    /// Reads the word at `src` (a copy on the default stream, waited for).
    fn read_word(&self, src: u64) -> Result<u32, Failed>;
}

/// What the probe's steps produced, before the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Observed {
    /// A step before the kernel ran failed: the probe proved nothing.
    Setup(Failed),
    /// The kernel's launch was refused.
    Launch(Failed),
    /// Waiting for the kernel failed with this error.
    Faulted(Failed),
    /// The kernel completed; B's buffer then held this word (or could not be read).
    Completed(Result<u32, Failed>),
}

/// Whether `code` is a GPU memory fault of a kernel (what a kernel dereferencing an address
/// its context has not mapped gets).
fn is_memory_fault(code: CuResult) -> bool {
    matches!(
        code,
        cuda::CUDA_ERROR_ILLEGAL_ADDRESS
            | cuda::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | cuda::CUDA_ERROR_LAUNCH_FAILED
    )
}

/// The verdict on what the probe observed.
pub(crate) fn decide(o: &Observed) -> VmmIsolation {
    match o {
        Observed::Setup(f) => VmmIsolation::Unknown(format!(
            "the probe could not be set up: {} failed with CUresult {}",
            f.call, f.code
        )),
        Observed::Launch(f) => VmmIsolation::Unknown(format!(
            "the probe kernel's launch failed with CUresult {}",
            f.code
        )),
        Observed::Faulted(f) if is_memory_fault(f.code) => VmmIsolation::Isolated,
        Observed::Faulted(f) => VmmIsolation::Unknown(format!(
            "the probe kernel failed with CUresult {} ({}), not with a memory fault",
            f.code, f.call
        )),
        Observed::Completed(Ok(PATTERN)) => VmmIsolation::Shared,
        Observed::Completed(Ok(v)) => VmmIsolation::Unknown(format!(
            "the probe kernel ran without a fault but read {v:#010x}, not the pattern \
             {PATTERN:#010x}"
        )),
        Observed::Completed(Err(f)) => VmmIsolation::Unknown(format!(
            "reading the probe kernel's result failed: {} failed with CUresult {}",
            f.call, f.code
        )),
    }
}

/// What the probe holds, released in reverse by [`Held::release`].
#[derive(Debug, Default)]
struct Held {
    a: Option<Ctx>,
    b: Option<Ctx>,
    /// A's reserved range `(va, size)`.
    reserved: Option<(u64, u64)>,
    /// A's physical memory.
    handle: Option<u64>,
    /// Whether the range is mapped to the handle.
    mapped: bool,
}

impl Held {
    /// Destroys B first (with everything made in it: its buffer, its module, and a sticky
    /// error if its kernel faulted), then unmaps, releases and unreserves A's VMM memory with A
    /// current, then destroys A. Failures are ignored: each step frees what it can.
    fn release(self, ops: &impl ProbeOps) {
        if let Some(b) = self.b {
            let _ = ops.ctx_destroy(b);
        }
        let pushed = self.a.is_some_and(|a| ops.ctx_push(a).is_ok());
        if let (Some((va, size)), true) = (self.reserved, self.mapped) {
            let _ = ops.unmap(va, size);
        }
        if let Some(h) = self.handle {
            let _ = ops.release(h);
        }
        if let Some((va, size)) = self.reserved {
            let _ = ops.unreserve(va, size);
        }
        if pushed {
            let _ = ops.ctx_pop();
        }
        if let Some(a) = self.a {
            let _ = ops.ctx_destroy(a);
        }
    }
}

/// Runs `f` with `c` current, popping it afterwards whatever `f` returned.
fn within<T>(
    ops: &impl ProbeOps,
    c: Ctx,
    f: impl FnOnce() -> Result<T, Observed>,
) -> Result<T, Observed> {
    ops.ctx_push(c).map_err(Observed::Setup)?;
    let r = f();
    let _ = ops.ctx_pop();
    r
}

/// The probe's steps; everything made is recorded in `held`.
fn steps(ops: &impl ProbeOps, held: &mut Held) -> Result<Observed, Observed> {
    let setup = Observed::Setup;
    let g = ops.granularity().map_err(setup)?;
    let a = ops.ctx_create().map_err(setup)?;
    held.a = Some(a);
    let va = within(ops, a, || {
        let h = ops.create(g).map_err(setup)?;
        held.handle = Some(h);
        let va = ops.reserve(g, g).map_err(setup)?;
        held.reserved = Some((va, g));
        ops.map(va, g, h).map_err(setup)?;
        held.mapped = true;
        ops.fill(va, PATTERN, g / WORD).map_err(setup)?;
        ops.sync().map_err(setup)?;
        Ok(va)
    })?;
    let b = ops.ctx_create().map_err(setup)?;
    held.b = Some(b);
    within(ops, b, || {
        let dst = ops.alloc(WORD).map_err(setup)?;
        ops.fill(dst, SENTINEL, 1).map_err(setup)?;
        ops.sync().map_err(setup)?;
        let m = ops.load(PROBE_PTX).map_err(setup)?;
        let k = ops.function(m, PROBE_KERNEL).map_err(setup)?;
        let mut params = [0u8; 16];
        params[..8].copy_from_slice(&va.to_le_bytes());
        params[8..].copy_from_slice(&dst.to_le_bytes());
        ops.launch(k, &params).map_err(Observed::Launch)?;
        ops.sync().map_err(Observed::Faulted)?;
        Ok(Observed::Completed(ops.read_word(dst)))
    })
}

/// Runs the probe over `ops`, releases everything it made, and returns the verdict.
pub(crate) fn probe_with(ops: &impl ProbeOps) -> VmmIsolation {
    let mut held = Held::default();
    let observed = steps(ops, &mut held).unwrap_or_else(|o| o);
    held.release(ops);
    decide(&observed)
}

/// [`ProbeOps`] on the real driver, device `dev`.
struct DriverOps<'a> {
    d: &'a Driver,
    dev: i32,
}

/// The legacy default stream of the current context.
const DEFAULT_STREAM: Stream = Stream(std::ptr::null_mut());

impl DriverOps<'_> {
    fn wait(&self, ev: Event) -> Result<(), Failed> {
        self.d.event_record(ev, DEFAULT_STREAM)?;
        let deadline = Instant::now() + PROBE_WAIT;
        loop {
            if self.d.event_query(ev)? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Failed {
                    call: "cuEventQuery",
                    code: cuda::CUDA_ERROR_LAUNCH_TIMEOUT,
                });
            }
            std::thread::sleep(POLL);
        }
    }
}

impl ProbeOps for DriverOps<'_> {
    fn granularity(&self) -> Result<u64, Failed> {
        self.d.vmm_granularity(MemPlace::Device(self.dev))
    }
    fn ctx_create(&self) -> Result<Ctx, Failed> {
        let c = self.d.ctx_create(self.dev)?;
        // cuCtxCreate made it current: back to the caller's context.
        if let Err(f) = self.d.ctx_pop() {
            let _ = self.d.ctx_destroy(c);
            return Err(f);
        }
        Ok(c)
    }
    fn ctx_destroy(&self, c: Ctx) -> Result<(), Failed> {
        self.d.ctx_destroy(c)
    }
    fn ctx_push(&self, c: Ctx) -> Result<(), Failed> {
        self.d.ctx_push(c)
    }
    fn ctx_pop(&self) -> Result<(), Failed> {
        self.d.ctx_pop().map(|_| ())
    }
    fn reserve(&self, size: u64, align: u64) -> Result<u64, Failed> {
        self.d.vmm_reserve(size, align)
    }
    fn unreserve(&self, va: u64, size: u64) -> Result<(), Failed> {
        self.d.vmm_free(va, size)
    }
    fn create(&self, size: u64) -> Result<u64, Failed> {
        self.d.vmm_create(size, self.dev)
    }
    fn release(&self, handle: u64) -> Result<(), Failed> {
        self.d.vmm_release(handle)
    }
    fn map(&self, va: u64, size: u64, handle: u64) -> Result<(), Failed> {
        self.d.vmm_map(va, size, handle, self.dev)
    }
    fn unmap(&self, va: u64, size: u64) -> Result<(), Failed> {
        self.d.vmm_unmap(va, size)
    }
    fn alloc(&self, size: u64) -> Result<u64, Failed> {
        self.d.mem_alloc(size)
    }
    fn fill(&self, dst: u64, value: u32, count: u64) -> Result<(), Failed> {
        let count = usize::try_from(count).map_err(|_| Failed {
            call: "cuMemsetD32Async",
            code: cuda::CUDA_ERROR_INVALID_VALUE,
        })?;
        self.d
            .memset_async(dst, value, WORD as u32, count, DEFAULT_STREAM)
    }
    fn load(&self, ptx: &str) -> Result<Module, Failed> {
        self.d.module_load(ptx.as_bytes()).map_err(|(f, log)| {
            tracing::debug!(log, "the VMM isolation probe's PTX did not load");
            f
        })
    }
    fn function(&self, m: Module, name: &str) -> Result<Function, Failed> {
        self.d.module_function(m, name)
    }
    fn launch(&self, f: Function, params: &[u8]) -> Result<(), Failed> {
        self.d
            .launch(f, [1, 1, 1], [1, 1, 1], 0, DEFAULT_STREAM, params, 0)
    }
    fn sync(&self) -> Result<(), Failed> {
        let ev = self.d.event_create(EVENT_DISABLE_TIMING)?;
        let r = self.wait(ev);
        // Fails in a context with a sticky error; destroying the context frees the event.
        let _ = self.d.event_destroy(ev);
        r
    }
    fn read_word(&self, src: u64) -> Result<u32, Failed> {
        let mut word = Box::new([0u8; WORD as usize]);
        // SAFETY: `word` is a heap buffer of WORD bytes that nothing else reads or writes; it
        // is read only after `sync` saw the copy complete, and leaked (kept valid forever)
        // when that could not be seen, so the copy never writes freed memory.
        let r = unsafe {
            self.d
                .memcpy_dtoh_async(word.as_mut_ptr(), src, word.len(), DEFAULT_STREAM)
        };
        // A refused copy was not queued: the buffer may go.
        r?;
        match self.sync() {
            Ok(()) => Ok(u32::from_le_bytes(*word)),
            Err(f) => {
                Box::leak(word);
                Err(f)
            }
        }
    }
}

/// Verdicts by (driver library, GPU UUID).
type Verdicts = HashMap<(String, [u8; 16]), VmmIsolation>;

/// Verdicts by (driver library, GPU UUID): a GPU's answer does not change while the process
/// runs, and opening a device again (the conformance suite does it per check) need not pay
/// for two more contexts. Only definite verdicts are kept.
fn cache() -> &'static Mutex<Verdicts> {
    static CACHE: OnceLock<Mutex<Verdicts>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Tests only (vgpud never calls it): the verdict every probe of this process gives from now on
/// instead of probing (`None`: probe again). The conformance suite over vgpu's own shim, whose
/// contexts share one VM's address space (the probe says `Shared` there), uses it to run the
/// executor's VMM and movable-allocation code as it would run on a GPU that isolates them.
#[doc(hidden)]
pub fn override_verdict(v: Option<VmmIsolation>) {
    *crate::context::lock(overridden()) = v;
}

fn overridden() -> &'static Mutex<Option<VmmIsolation>> {
    static OVERRIDE: OnceLock<Mutex<Option<VmmIsolation>>> = OnceLock::new();
    OVERRIDE.get_or_init(Default::default)
}

/// Probes device `dev` (UUID `uuid`) of `d`; `vmm_supported` is its
/// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
pub(crate) fn probe(d: &Driver, dev: i32, uuid: [u8; 16], vmm_supported: i32) -> VmmIsolation {
    if !d.has_vmm() || vmm_supported == 0 {
        return VmmIsolation::Unknown("this GPU or driver has no virtual memory management".into());
    }
    if let Some(v) = crate::context::lock(overridden()).clone() {
        return v;
    }
    let key = (d.library().to_string(), uuid);
    if let Some(v) = crate::context::lock(cache()).get(&key) {
        return v.clone();
    }
    let v = probe_with(&DriverOps { d, dev });
    if !matches!(v, VmmIsolation::Unknown(_)) {
        crate::context::lock(cache()).insert(key, v.clone());
    }
    v
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::collections::BTreeSet;
    use std::ffi::c_void;

    use super::*;

    const VA: u64 = 0x7f00_0000_0000;
    const HANDLE: u64 = 42;
    const DST: u64 = 0x7e00_0000_0000;
    const GRANULE: u64 = 2 << 20;

    /// A driver that records the probe's calls, tracks the thread's context stack and what is
    /// alive, and answers as configured.
    struct Fake {
        log: RefCell<Vec<String>>,
        stack: RefCell<Vec<usize>>,
        live: RefCell<BTreeSet<String>>,
        contexts: Cell<usize>,
        launched: Cell<bool>,
        /// `(call, nth)`: the nth call (1-based) of this name fails with CUDA_ERROR_UNKNOWN.
        fail: Option<(&'static str, usize)>,
        calls: RefCell<Vec<&'static str>>,
        /// What waiting for the kernel gives.
        kernel: Result<(), CuResult>,
        /// What the launch gives.
        launch: Result<(), CuResult>,
        /// The word B's buffer holds after the kernel.
        word: u32,
    }

    impl Fake {
        fn new() -> Fake {
            Fake {
                log: RefCell::default(),
                stack: RefCell::new(vec![usize::MAX]),
                live: RefCell::default(),
                contexts: Cell::new(0),
                launched: Cell::new(false),
                fail: None,
                calls: RefCell::default(),
                kernel: Ok(()),
                launch: Ok(()),
                word: PATTERN,
            }
        }

        fn call(&self, name: &'static str, what: String) -> Result<(), Failed> {
            self.calls.borrow_mut().push(name);
            let n = self.calls.borrow().iter().filter(|c| **c == name).count();
            self.log.borrow_mut().push(what);
            if self.fail == Some((name, n)) {
                return Err(Failed {
                    call: name,
                    code: cuda::CUDA_ERROR_UNKNOWN,
                });
            }
            Ok(())
        }

        fn current(&self) -> usize {
            *self.stack.borrow().last().unwrap()
        }

        fn run(&self) -> VmmIsolation {
            let v = probe_with(self);
            assert_eq!(
                *self.stack.borrow(),
                vec![usize::MAX],
                "the caller's context is current again, nothing else stacked"
            );
            assert!(
                self.live.borrow().is_empty(),
                "left behind: {:?}\n{:#?}",
                self.live.borrow(),
                self.log.borrow()
            );
            v
        }

        fn log(&self) -> Vec<String> {
            self.log.borrow().clone()
        }
    }

    fn ctx(n: usize) -> Ctx {
        Ctx(n as *mut c_void)
    }

    impl ProbeOps for Fake {
        fn granularity(&self) -> Result<u64, Failed> {
            self.call("granularity", "granularity".into())?;
            Ok(GRANULE)
        }
        fn ctx_create(&self) -> Result<Ctx, Failed> {
            self.call("ctx_create", "create ctx".into())?;
            let n = self.contexts.get() + 1;
            self.contexts.set(n);
            self.live.borrow_mut().insert(format!("ctx{n}"));
            Ok(ctx(n))
        }
        fn ctx_destroy(&self, c: Ctx) -> Result<(), Failed> {
            let n = c.0 as usize;
            assert!(
                !self.stack.borrow().contains(&n),
                "ctx{n} destroyed while on the stack"
            );
            // A context's own memory and modules go with it.
            let mut live = self.live.borrow_mut();
            assert!(live.remove(&format!("ctx{n}")), "ctx{n} destroyed twice");
            live.retain(|r| !r.ends_with(&format!("@ctx{n}")));
            drop(live);
            self.call("ctx_destroy", format!("destroy ctx{n}"))
        }
        fn ctx_push(&self, c: Ctx) -> Result<(), Failed> {
            self.call("ctx_push", format!("push ctx{}", c.0 as usize))?;
            self.stack.borrow_mut().push(c.0 as usize);
            Ok(())
        }
        fn ctx_pop(&self) -> Result<(), Failed> {
            let top = self.stack.borrow_mut().pop().unwrap();
            assert_ne!(top, usize::MAX, "popped the caller's context");
            self.call("ctx_pop", format!("pop ctx{top}"))
        }
        fn reserve(&self, size: u64, align: u64) -> Result<u64, Failed> {
            assert_eq!((size, align), (GRANULE, GRANULE));
            self.call("reserve", "reserve".into())?;
            self.live.borrow_mut().insert("range".into());
            Ok(VA)
        }
        fn unreserve(&self, va: u64, size: u64) -> Result<(), Failed> {
            assert_eq!((va, size), (VA, GRANULE));
            assert!(
                !self.live.borrow().contains("mapping"),
                "freed while mapped"
            );
            self.live.borrow_mut().remove("range");
            self.call("unreserve", "unreserve".into())
        }
        fn create(&self, size: u64) -> Result<u64, Failed> {
            assert_eq!(size, GRANULE);
            self.call("create", "cuMemCreate".into())?;
            self.live.borrow_mut().insert("physical".into());
            Ok(HANDLE)
        }
        fn release(&self, handle: u64) -> Result<(), Failed> {
            assert_eq!(handle, HANDLE);
            self.live.borrow_mut().remove("physical");
            self.call("release", "release".into())
        }
        fn map(&self, va: u64, size: u64, handle: u64) -> Result<(), Failed> {
            assert_eq!((va, size, handle), (VA, GRANULE, HANDLE));
            self.call("map", format!("map in ctx{}", self.current()))?;
            self.live.borrow_mut().insert("mapping".into());
            Ok(())
        }
        fn unmap(&self, va: u64, size: u64) -> Result<(), Failed> {
            assert_eq!((va, size), (VA, GRANULE));
            self.live.borrow_mut().remove("mapping");
            self.call("unmap", "unmap".into())
        }
        fn alloc(&self, size: u64) -> Result<u64, Failed> {
            assert_eq!(size, WORD);
            self.call("alloc", format!("alloc in ctx{}", self.current()))?;
            let c = self.current();
            self.live.borrow_mut().insert(format!("dst@ctx{c}"));
            Ok(DST)
        }
        fn fill(&self, dst: u64, value: u32, count: u64) -> Result<(), Failed> {
            self.call(
                "fill",
                format!("fill {dst:#x} {value:#x} x{count} in ctx{}", self.current()),
            )
        }
        fn load(&self, ptx: &str) -> Result<Module, Failed> {
            assert_eq!(ptx, PROBE_PTX);
            self.call("load", format!("load in ctx{}", self.current()))?;
            let c = self.current();
            self.live.borrow_mut().insert(format!("module@ctx{c}"));
            Ok(Module(7 as *mut c_void))
        }
        fn function(&self, _m: Module, name: &str) -> Result<Function, Failed> {
            assert_eq!(name, PROBE_KERNEL);
            self.call("function", "function".into())?;
            Ok(Function(8 as *mut c_void))
        }
        fn launch(&self, _f: Function, params: &[u8]) -> Result<(), Failed> {
            let mut want = VA.to_le_bytes().to_vec();
            want.extend_from_slice(&DST.to_le_bytes());
            assert_eq!(params, want, "src = A's mapping, dst = B's buffer");
            self.call("launch", format!("launch in ctx{}", self.current()))?;
            self.launched.set(true);
            self.launch.map_err(|code| Failed {
                call: "cuLaunchKernel",
                code,
            })
        }
        fn sync(&self) -> Result<(), Failed> {
            self.call("sync", format!("sync ctx{}", self.current()))?;
            if self.launched.get() {
                return self.kernel.map_err(|code| Failed {
                    call: "cuEventQuery",
                    code,
                });
            }
            Ok(())
        }
        fn read_word(&self, src: u64) -> Result<u32, Failed> {
            assert_eq!(src, DST);
            self.call("read", format!("read in ctx{}", self.current()))?;
            Ok(self.word)
        }
    }

    #[test]
    fn a_fault_in_the_other_context_proves_isolation() {
        let f = Fake {
            kernel: Err(cuda::CUDA_ERROR_ILLEGAL_ADDRESS),
            ..Fake::new()
        };
        assert_eq!(f.run(), VmmIsolation::Isolated);
        let log = f.log();
        let expect: Vec<String> = [
            "granularity",
            "create ctx",
            "push ctx1",
            "cuMemCreate",
            "reserve",
            "map in ctx1",
            &format!("fill {VA:#x} {PATTERN:#x} x{} in ctx1", GRANULE / 4),
            "sync ctx1",
            "pop ctx1",
            "create ctx",
            "push ctx2",
            "alloc in ctx2",
            &format!("fill {DST:#x} {SENTINEL:#x} x1 in ctx2"),
            "sync ctx2",
            "load in ctx2",
            "function",
            "launch in ctx2",
            "sync ctx2",
            "pop ctx2",
            // Cleanup: B (in its error state) first, then A's VMM memory with A current.
            "destroy ctx2",
            "push ctx1",
            "unmap",
            "release",
            "unreserve",
            "pop ctx1",
            "destroy ctx1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(log, expect);
    }

    #[test]
    fn the_other_context_reading_the_pattern_proves_sharing() {
        let f = Fake::new();
        assert_eq!(f.run(), VmmIsolation::Shared);
        assert!(f.log().contains(&"read in ctx2".to_string()));
        assert!(
            VmmIsolation::Shared
                .refusal()
                .unwrap()
                .contains("reachable")
        );
    }

    #[test]
    fn other_outcomes_are_unknown() {
        // The kernel ran but did not bring the pattern back.
        for word in [SENTINEL, 0] {
            let f = Fake {
                word,
                ..Fake::new()
            };
            let v = f.run();
            assert!(
                matches!(&v, VmmIsolation::Unknown(w) if w.contains("not the pattern")),
                "{v}"
            );
        }
        // A failure that is not a memory fault.
        let f = Fake {
            kernel: Err(cuda::CUDA_ERROR_LAUNCH_TIMEOUT),
            ..Fake::new()
        };
        assert!(matches!(f.run(), VmmIsolation::Unknown(_)));
        // The launch refused: the kernel never ran, nothing is proven.
        let f = Fake {
            launch: Err(cuda::CUDA_ERROR_ILLEGAL_ADDRESS),
            ..Fake::new()
        };
        assert!(matches!(f.run(), VmmIsolation::Unknown(w) if w.contains("launch")));
    }

    #[test]
    fn a_probe_that_cannot_be_set_up_is_unknown_and_cleans_up() {
        let steps: &[(&str, usize)] = &[
            ("granularity", 1),
            ("ctx_create", 1),
            ("ctx_push", 1),
            ("create", 1),
            ("reserve", 1),
            ("map", 1),
            ("fill", 1),
            ("sync", 1),
            ("ctx_create", 2),
            ("ctx_push", 2),
            ("alloc", 1),
            ("fill", 2),
            ("sync", 2),
            ("load", 1),
            ("function", 1),
        ];
        for &(call, nth) in steps {
            let f = Fake {
                fail: Some((call, nth)),
                ..Fake::new()
            };
            // `run` checks that the stack is the caller's and nothing is left.
            let v = f.run();
            match &v {
                VmmIsolation::Unknown(w) => assert!(w.contains("could not be set up"), "{w}"),
                v => panic!("{call} #{nth} failing gave {v}"),
            }
            assert!(v.refusal().unwrap().contains("could not prove"), "{v}");
            assert!(
                !f.log().iter().any(|l| l.starts_with("launch")),
                "{call} #{nth}: no launch after a failed setup"
            );
        }
    }

    #[test]
    fn cleanup_failures_do_not_stop_the_rest_of_the_cleanup() {
        for call in ["unmap", "release", "unreserve"] {
            let f = Fake {
                fail: Some((call, 1)),
                kernel: Err(cuda::CUDA_ERROR_ILLEGAL_ADDRESS),
                ..Fake::new()
            };
            assert_eq!(f.run(), VmmIsolation::Isolated, "{call}");
        }
        // Context A cannot be made current for the cleanup: its VMM memory is still released
        // (VMM calls need no current context) and A destroyed.
        let f = Fake {
            fail: Some(("ctx_push", 3)),
            kernel: Err(cuda::CUDA_ERROR_ILLEGAL_ADDRESS),
            ..Fake::new()
        };
        assert_eq!(f.run(), VmmIsolation::Isolated);
    }

    #[test]
    fn memory_faults_decide_isolation_other_errors_do_not() {
        let fault = |code| {
            decide(&Observed::Faulted(Failed {
                call: "cuEventQuery",
                code,
            }))
        };
        for code in [
            cuda::CUDA_ERROR_ILLEGAL_ADDRESS,
            cuda::CUDA_ERROR_INVALID_ADDRESS_SPACE,
            cuda::CUDA_ERROR_LAUNCH_FAILED,
        ] {
            assert_eq!(fault(code), VmmIsolation::Isolated, "{code}");
        }
        for code in [
            cuda::CUDA_ERROR_LAUNCH_TIMEOUT,
            cuda::CUDA_ERROR_UNKNOWN,
            cuda::CUDA_ERROR_INVALID_VALUE,
        ] {
            assert!(!fault(code).proven(), "{code}");
        }
        assert!(VmmIsolation::Isolated.refusal().is_none());
        assert_eq!(VmmIsolation::Isolated.to_string(), "isolated");
        assert!(
            VmmIsolation::Unknown("x".into())
                .to_string()
                .starts_with("unknown (x")
        );
    }

    #[test]
    fn the_probe_kernel_parses_and_takes_two_pointers() {
        let text = PROBE_PTX
            .strip_suffix('\0')
            .expect("NUL-terminated for the driver");
        let m = vgpu_ptx::Module::load(text).expect("the probe's PTX");
        let k = m.kernel(PROBE_KERNEL).expect("the probe kernel");
        assert_eq!(k.param_bytes, 16, "(src, dst) pointers");
    }
}
