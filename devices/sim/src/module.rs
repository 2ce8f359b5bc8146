//! Modules on the simulated GPU: PTX parsed by `vgpu-ptx`, module globals
//! allocated in the tenant's memory, and launches steered by the broker's
//! [`RunControl`].

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_broker::device::{
    DeviceError, DeviceHeap, DeviceModule, GlobalDesc, GraphConditionals, HostStateBudget,
    KernelDesc, LaunchDims, LaunchProgress, RunControl, Signal,
};
use vgpu_broker::devio::LaunchOutput;
use vgpu_broker::texture::ReferenceKind;
use vgpu_fatbin::PtxRange;
use vgpu_proto::cuda::{self, func_attr};
use vgpu_ptx::{GlobalSpace, Launch, LaunchControl, LoadErrorKind, LoadWatch, Module, Progress};

use crate::ContextMemory;
use crate::alloc::aligned;

/// ELF magic: a cubin.
const ELF_MAGIC: &[u8] = b"\x7fELF";
/// Shared memory a block may use without opting in (`cuFuncSetAttribute`).
pub const DEFAULT_MAX_DYNAMIC_SHARED: usize = 48 << 10;
/// Shared memory a block may use after opting in.
pub const OPTIN_MAX_SHARED: usize = 163 << 10;
/// `CU_FUNC_ATTRIBUTE_BINARY_VERSION` reported (sm_80); also the newest PTX
/// architecture taken from a fat binary.
const BINARY_VERSION: i32 = 80;
/// Most registers per thread reported.
const MAX_REGS_PER_THREAD: u32 = 255;
/// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK` of a cubin kernel.
const MAX_THREADS_PER_BLOCK: i32 = 1024;
/// How often a module load asks whether its client is still connected (a system call); the
/// deadline and the cancel flag are checked at every question of the interpreter's loader.
const HANGUP_CHECK_INTERVAL: Duration = Duration::from_millis(10);

/// The interpreter's loader asks this whether to go on: past the load's deadline it stops with
/// `TimedOut`, once its client has gone (or the load was cancelled) with `Cancelled`.
struct LoadGate<'a> {
    control: &'a RunControl,
    /// When the client was last asked about (`None`: not yet).
    last_hangup_check: Option<Instant>,
}

impl LoadWatch for LoadGate<'_> {
    fn check(&mut self) -> Option<LoadErrorKind> {
        if self.control.past_deadline() {
            return Some(LoadErrorKind::TimedOut);
        }
        let due = self
            .last_hangup_check
            .is_none_or(|t| t.elapsed() >= HANGUP_CHECK_INTERVAL);
        let cancelled = if due {
            self.last_hangup_check = Some(Instant::now());
            self.control.poll_cancelled()
        } else {
            self.control.cancelled()
        };
        cancelled.then_some(LoadErrorKind::Cancelled)
    }
}

/// The tenant's budget for host-side device state, as the interpreter takes from it.
#[derive(Debug)]
struct StateBudget(Arc<dyn HostStateBudget>);

impl vgpu_ptx::StateBudget for StateBudget {
    fn take(&self, bytes: u64) -> bool {
        self.0.take(bytes)
    }

    fn give_back(&self, bytes: u64) {
        self.0.give_back(bytes);
    }
}

/// A cubin entry decompressed, and what it is ("sm_80 cubin").
fn cubin_of(e: &vgpu_fatbin::Entry<'_>) -> Option<(Vec<u8>, String)> {
    Some((e.contents().ok()?, e.describe()))
}

/// A module loaded on the simulated GPU.
pub struct SimModule {
    /// The interpreted code; `None` for a cubin, whose kernels are known
    /// (names, parameters) but whose SASS the simulated GPU cannot run.
    module: Option<Module>,
    /// What a cubin module holds, for the launch error ("sm_80 cubin").
    sass: String,
    kernels: Vec<KernelDesc>,
    /// The kernels' attributes as loaded, which kernels read with the device runtime
    /// (`cudaFuncGetAttributes`, occupancy).
    kernel_attributes: Arc<[Vec<i32>]>,
    globals: Vec<GlobalDesc>,
    addrs: Vec<u64>,
    memory: Arc<ContextMemory>,
}

impl std::fmt::Debug for SimModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimModule")
            .field("kernels", &self.kernels.len())
            .field("globals", &self.globals.len())
            .finish()
    }
}

/// `CU_FUNC_ATTRIBUTE_PTX_VERSION` of a PTX module's kernels: the virtual architecture the
/// PTX was compiled for (`.target sm_52` is 52), as CUDA reports it (`cudaFuncAttributes::
/// ptxVersion`). It is not the PTX ISA version of `.version`: CUB and Thrust compare it with the
/// `__CUDA_ARCH__` the kernels were compiled for to pick the tuning the device code was built
/// with, and a larger value makes the host size tiles the kernels do not use.
fn ptx_target(text: &str) -> i32 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(".target"))
        .and_then(|t| {
            let first = t
                .split(|c: char| c == ',' || c.is_whitespace())
                .find(|w| !w.is_empty())?;
            let digits: String = first
                .strip_prefix("sm_")?
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .unwrap_or(0)
}

impl SimModule {
    /// Parses an image, allocates its globals (at most `budget` bytes) and
    /// writes their initial values. Parsing stops past `control`'s deadline or
    /// once it is cancelled (its client has gone).
    pub(crate) fn load(
        memory: &Arc<ContextMemory>,
        image: &[u8],
        budget: u64,
        control: &RunControl,
    ) -> Result<SimModule, DeviceError> {
        if image.starts_with(ELF_MAGIC) {
            return Self::load_cubin(memory, image, "cubin".into(), budget);
        }
        let from_fatbin;
        let mut fallback = None;
        let image = if vgpu_fatbin::is_fatbin(image) {
            let fatbin_error = |e: vgpu_fatbin::FatbinError| DeviceError::InvalidImage {
                code: match e {
                    vgpu_fatbin::FatbinError::NoUsableImage { .. } => {
                        cuda::CUDA_ERROR_NO_BINARY_FOR_GPU
                    }
                    _ => cuda::CUDA_ERROR_INVALID_IMAGE,
                },
                message: e.to_string(),
            };
            let all = vgpu_fatbin::entries(image).map_err(fatbin_error)?;
            // PTX of any architecture; the cubin comes with PTX for a newer GPU only, to declare
            // the kernels where that PTX does not load (an instruction the interpreter lacks).
            let choice = vgpu_fatbin::choose(&all, BINARY_VERSION as u32, PtxRange::Any);
            let Some(ptx) = choice.ptx else {
                // No PTX at all: the cubin a real device of this compute capability would take
                // declares the kernels, which cannot be launched.
                return match choice.cubin.as_ref().and_then(cubin_of) {
                    Some((elf, what)) => Self::load_cubin(memory, &elf, what, budget),
                    None => Err(fatbin_error(vgpu_fatbin::no_usable_image(&all))),
                };
            };
            fallback = choice.cubin;
            from_fatbin = ptx.ptx_text().map_err(fatbin_error)?;
            &from_fatbin[..]
        } else {
            image
        };
        let end = image.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let text = std::str::from_utf8(&image[..end]).map_err(|e| DeviceError::InvalidImage {
            code: cuda::CUDA_ERROR_INVALID_IMAGE,
            message: format!("the module image is neither PTX text nor a known binary format: {e}"),
        })?;
        let mut gate = LoadGate {
            control,
            last_hangup_check: None,
        };
        let loaded = Module::load_watched(text, &mut gate);
        if let Err(e) = &loaded
            && matches!(
                e.kind,
                LoadErrorKind::InvalidPtx | LoadErrorKind::NotSupported
            )
            && let Some((elf, what)) = fallback.as_ref().and_then(cubin_of)
        {
            tracing::debug!(
                "the fat binary's PTX for a newer GPU does not load ({e}); its {what} declares \
                 the kernels instead"
            );
            return Self::load_cubin(memory, &elf, what, budget);
        }
        let module = loaded.map_err(|e| match e.kind {
            LoadErrorKind::InvalidPtx => DeviceError::InvalidImage {
                code: cuda::CUDA_ERROR_INVALID_PTX,
                message: e.to_string(),
            },
            LoadErrorKind::NotSupported => DeviceError::InvalidImage {
                code: cuda::CUDA_ERROR_NOT_SUPPORTED,
                message: e.to_string(),
            },
            LoadErrorKind::TimedOut | LoadErrorKind::Cancelled => {
                DeviceError::LoadStopped(format!("{} (at PTX line {})", e.message, e.line))
            }
        })?;
        let need: u64 = module
            .globals()
            .iter()
            .map(|g| aligned((g.size as u64).max(1)).unwrap_or(u64::MAX))
            .fold(0u64, u64::saturating_add);
        if need > budget {
            return Err(DeviceError::OutOfMemory);
        }
        let mut m = SimModule {
            kernels: Vec::new(),
            kernel_attributes: Arc::new([]),
            globals: Vec::new(),
            addrs: Vec::new(),
            memory: Arc::clone(memory),
            module: None,
            sass: String::new(),
        };
        let mut bufs = Vec::with_capacity(module.globals().len());
        for g in module.globals() {
            // On failure, `m` is dropped and frees the globals allocated so far.
            let (addr, buf) = memory.alloc(g.size as u64)?;
            m.addrs.push(addr);
            bufs.push(buf);
        }
        // Initial values once every variable has its address (initializers may hold them).
        for ((g, buf), &addr) in module.globals().iter().zip(&bufs).zip(&m.addrs) {
            let image = g.image(&m.addrs);
            if !image.is_empty() {
                buf.write(0, &image)
                    .map_err(|_| DeviceError::InvalidAddress {
                        addr,
                        len: image.len() as u64,
                    })?;
            }
        }
        for (g, &addr) in module.globals().iter().zip(&m.addrs) {
            m.globals.push(GlobalDesc {
                name: g.name.clone(),
                addr,
                size: g.size as u64,
                managed: g.managed,
                reference: g.reference.map(|r| match r {
                    vgpu_ptx::texture::ReferenceKind::Texture => ReferenceKind::Texture,
                    vgpu_ptx::texture::ReferenceKind::Surface => ReferenceKind::Surface,
                }),
            });
        }
        let const_bytes: usize = module
            .globals()
            .iter()
            .filter(|g| g.space == GlobalSpace::Const)
            .map(|g| g.size)
            .sum();
        let version = ptx_target(text);
        m.kernels = module
            .kernels()
            .iter()
            .map(|k| {
                let mut a = vec![0; func_attr::COUNT];
                let clamp = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
                a[func_attr::MAX_THREADS_PER_BLOCK] = clamp(k.max_threads_per_block as usize);
                a[func_attr::SHARED_SIZE_BYTES] = clamp(k.static_shared_bytes);
                a[func_attr::CONST_SIZE_BYTES] = clamp(const_bytes);
                a[func_attr::LOCAL_SIZE_BYTES] = clamp(k.local_bytes);
                a[func_attr::NUM_REGS] = clamp(k.num_regs.min(MAX_REGS_PER_THREAD) as usize);
                a[func_attr::PTX_VERSION] = version;
                a[func_attr::BINARY_VERSION] = BINARY_VERSION;
                a[func_attr::MAX_DYNAMIC_SHARED_SIZE_BYTES] =
                    clamp(DEFAULT_MAX_DYNAMIC_SHARED.saturating_sub(k.static_shared_bytes));
                a[func_attr::PREFERRED_SHARED_MEMORY_CARVEOUT] = -1;
                KernelDesc {
                    name: k.name.clone(),
                    param_offsets: k.params.iter().map(|p| p.offset as u32).collect(),
                    param_sizes: k.params.iter().map(|p| p.size as u32).collect(),
                    attributes: a,
                    runnable: true,
                }
            })
            .collect();
        m.kernel_attributes = m.kernels.iter().map(|k| k.attributes.clone()).collect();
        m.module = Some(module);
        Ok(m)
    }

    /// A cubin module: its kernels (names, parameter layouts) and variables
    /// are known, so libraries that look their kernels up and query them
    /// (cuBLAS at `cublasCreate`) work; launching one fails with
    /// `CUDA_ERROR_NO_BINARY_FOR_GPU`, as the simulated GPU cannot run SASS.
    fn load_cubin(
        memory: &Arc<ContextMemory>,
        elf: &[u8],
        what: String,
        budget: u64,
    ) -> Result<SimModule, DeviceError> {
        let c = vgpu_fatbin::cubin::read(elf).map_err(|e| DeviceError::InvalidImage {
            code: cuda::CUDA_ERROR_INVALID_IMAGE,
            message: e.to_string(),
        })?;
        // What a device of this compute capability would refuse at load.
        let arch = BINARY_VERSION as u32;
        if let Some(a) = c.arch
            && (a / 10 != arch / 10 || a > arch)
        {
            return Err(DeviceError::InvalidImage {
                code: cuda::CUDA_ERROR_NO_BINARY_FOR_GPU,
                message: format!(
                    "an sm_{a} cubin does not run on compute capability {}.{}, and the simulated GPU runs PTX only: build with -gencode arch=compute_XX,code=compute_XX",
                    arch / 10,
                    arch % 10
                ),
            });
        }
        let need: u64 = c
            .variables
            .iter()
            .map(|v| aligned(v.size.max(1)).unwrap_or(u64::MAX))
            .fold(0u64, u64::saturating_add);
        if need > budget {
            return Err(DeviceError::OutOfMemory);
        }
        let mut m = SimModule {
            module: None,
            sass: what,
            kernels: Vec::new(),
            kernel_attributes: Arc::new([]),
            globals: Vec::new(),
            addrs: Vec::new(),
            memory: Arc::clone(memory),
        };
        for v in &c.variables {
            // On failure, `m` is dropped and frees what was allocated so far.
            let (addr, _) = memory.alloc(v.size)?;
            m.addrs.push(addr);
            m.globals.push(GlobalDesc {
                name: v.name.clone(),
                addr,
                size: v.size,
                // A cubin's variables: whether one is managed is not read from the ELF.
                managed: false,
                reference: None,
            });
        }
        m.kernels = c
            .kernels
            .iter()
            .map(|k| {
                let mut a = vec![0; func_attr::COUNT];
                a[func_attr::MAX_THREADS_PER_BLOCK] = MAX_THREADS_PER_BLOCK;
                a[func_attr::BINARY_VERSION] = BINARY_VERSION;
                a[func_attr::MAX_DYNAMIC_SHARED_SIZE_BYTES] = DEFAULT_MAX_DYNAMIC_SHARED as i32;
                a[func_attr::PREFERRED_SHARED_MEMORY_CARVEOUT] = -1;
                KernelDesc {
                    name: k.name.clone(),
                    param_offsets: k.params.iter().map(|p| p.offset).collect(),
                    param_sizes: k.params.iter().map(|p| p.size).collect(),
                    attributes: a,
                    runnable: false,
                }
            })
            .collect();
        Ok(m)
    }

    /// Runs kernel `kernel` from `start_block`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch(
        &self,
        memory: &ContextMemory,
        kernel: usize,
        dims: &LaunchDims,
        params: &[u8],
        start_block: u64,
        workers: usize,
        slots: &Arc<vgpu_ptx::WorkerSlots>,
        control: &RunControl,
    ) -> Result<LaunchProgress, DeviceError> {
        let k = self
            .kernels
            .get(kernel)
            .ok_or_else(|| DeviceError::NotSupported(format!("no kernel #{kernel}")))?;
        let Some(module) = &self.module else {
            return Err(DeviceError::InvalidLaunch {
                code: cuda::CUDA_ERROR_NO_BINARY_FOR_GPU,
                message: format!(
                    "kernel `{}` comes from a {} (SASS), which the simulated GPU cannot run: it runs PTX (build with -gencode arch=compute_XX,code=compute_XX)",
                    k.name, self.sass
                ),
            });
        };
        let ptx_control = Arc::new(LaunchControl::new());
        ptx_control.set_deadline(control.deadline());
        ptx_control.set_slots(Some(Arc::clone(slots)));
        ptx_control.set_priority(vgpu_broker::device::current_priority());
        ptx_control.set_state_budget(
            control
                .state_budget()
                .map(|b| Arc::new(StateBudget(b)) as Arc<dyn vgpu_ptx::StateBudget>),
        );
        let forward = Arc::clone(&ptx_control);
        control.attach(Arc::new(move |s| match s {
            Signal::Yield => forward.request_yield(),
            Signal::Cancel => forward.cancel(),
        }));
        ptx_control.set_output(
            control
                .output()
                .map(|o| Arc::new(Output(o)) as Arc<dyn vgpu_ptx::DeviceOutput>),
        );
        ptx_control.set_conditionals(
            control
                .conditionals()
                .map(|c| Arc::new(Conditionals(c)) as Arc<dyn vgpu_ptx::GraphConditionals>),
        );
        // Grids the kernel launches wait in state that outlives a yield.
        if module.launches_kernels() {
            let limits = control.device_limits();
            let get = |l: u32, default: u32| {
                limits
                    .as_deref()
                    .and_then(|v| v.get(l as usize))
                    .map_or(u64::from(default), |&v| v)
            };
            let limit = usize::try_from(get(
                cuda::limit::DEV_RUNTIME_PENDING_LAUNCH_COUNT,
                cuda::limit::DEFAULT_PENDING_LAUNCH_COUNT,
            ))
            .unwrap_or(usize::MAX);
            let sync_depth = u32::try_from(get(
                cuda::limit::DEV_RUNTIME_SYNC_DEPTH,
                cuda::limit::DEFAULT_SYNC_DEPTH,
            ))
            .unwrap_or(u32::MAX);
            ptx_control.set_device_launches(control.device_state(|| {
                vgpu_ptx::devlaunch::DeviceLaunches::with_limits(limit, sync_depth)
            }));
        }
        ptx_control.set_device_attributes(control.device_attributes());
        ptx_control.set_device_limits(control.device_limits());
        ptx_control.set_function_attributes(Some(Arc::clone(&self.kernel_attributes)));
        ptx_control.set_heap(control.heap().and_then(|h| {
            h.as_any()
                .downcast_ref::<SimHeap>()
                .map(|h| Arc::clone(&h.heap) as Arc<dyn vgpu_ptx::heap::DeviceHeap>)
        }));
        // A cooperative launch's grid barrier lives in a small zeroed allocation of the
        // context's own, for the launch's duration.
        let workspace = if dims.cooperative {
            let (addr, _) = memory.alloc(vgpu_ptx::GRID_WORKSPACE_BYTES)?;
            ptx_control.set_grid_workspace(addr);
            Some(addr)
        } else {
            None
        };
        // A migration of this context's memory asks the launch to yield (see `ContextMemory::migrate`).
        memory.running(&ptx_control, true);
        let r = module.launch(&Launch {
            kernel: &k.name,
            grid: dims.grid,
            block: dims.block,
            dynamic_shared: dims.shared_bytes,
            params,
            globals: &self.addrs,
            memory,
            start_block,
            workers,
            control: &ptx_control,
        });
        memory.running(&ptx_control, false);
        control.detach();
        if let Some(addr) = workspace {
            let _ = memory.free(addr);
        }
        match r {
            Ok(Progress::Completed(_)) => Ok(LaunchProgress::Completed),
            Ok(Progress::Yielded { next_block, .. }) => Ok(LaunchProgress::Yielded { next_block }),
            // A rejected configuration or an oversized register file: nothing
            // ran, and the context goes on (not sticky).
            Err(f) if !f.is_sticky() => Err(DeviceError::InvalidLaunch {
                code: f.cuda_error(),
                message: f.message,
            }),
            Err(f) => Err(DeviceError::Fault {
                code: f.cuda_error(),
                message: f.message,
            }),
        }
    }
}

/// The broker's per-launch output buffer, as the interpreter writes `printf` text and `assert`
/// messages into it.
#[derive(Debug)]
struct Output(Arc<LaunchOutput>);

impl vgpu_ptx::DeviceOutput for Output {
    fn room(&self) -> usize {
        self.0.room()
    }

    fn printf(&self, text: &[u8]) {
        self.0.printf(text);
    }

    fn assert_failed(&self, message: &[u8]) {
        self.0.assert_failed(message);
    }
}

/// The conditional handles of the broker's graph launch, as kernels set them with
/// `cudaGraphSetConditional`.
#[derive(Debug)]
struct Conditionals(Arc<GraphConditionals>);

impl vgpu_ptx::GraphConditionals for Conditionals {
    fn set(&self, handle: u64, value: u32) -> bool {
        self.0.set(handle, value)
    }
}

impl DeviceModule for SimModule {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn kernels(&self) -> &[KernelDesc] {
        &self.kernels
    }

    fn globals(&self) -> &[GlobalDesc] {
        &self.globals
    }

    fn global_bytes(&self) -> u64 {
        self.globals
            .iter()
            .map(|g| aligned(g.size.max(1)).unwrap_or(g.size))
            .sum()
    }

    fn uses_heap(&self) -> bool {
        self.module.as_ref().is_some_and(Module::uses_heap)
    }
}

/// A process's device heap on the simulated GPU: an allocation of the context's memory, and
/// the interpreter's bookkeeping of what `malloc` handed out of it.
pub(crate) struct SimHeap {
    memory: Arc<ContextMemory>,
    base: u64,
    heap: Arc<vgpu_ptx::heap::Heap>,
}

impl SimHeap {
    /// A heap of `size` bytes in `memory`.
    pub(crate) fn new(memory: &Arc<ContextMemory>, size: u64) -> Result<SimHeap, DeviceError> {
        let (base, _) = memory.alloc(size)?;
        Ok(SimHeap {
            memory: Arc::clone(memory),
            base,
            heap: Arc::new(vgpu_ptx::heap::Heap::new(base, size)),
        })
    }
}

impl DeviceHeap for SimHeap {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for SimHeap {
    fn drop(&mut self) {
        let _ = self.memory.free(self.base);
    }
}

impl Drop for SimModule {
    fn drop(&mut self) {
        for &a in &self.addrs {
            let _ = self.memory.free(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_s_ptx_version_is_the_architecture_its_ptx_targets() {
        let ptx = |target: &str| format!("//\n.version 7.8\n.target {target}\n.address_size 64\n");
        assert_eq!(ptx_target(&ptx("sm_52")), 52);
        assert_eq!(ptx_target(&ptx("sm_90a")), 90);
        assert_eq!(ptx_target(&ptx("sm_80, texmode_independent")), 80);
        assert_eq!(ptx_target(&ptx("sm_70 ,debug")), 70);
        assert_eq!(ptx_target("no target here"), 0);
        assert_eq!(ptx_target(".target compute_80"), 0);
    }
}
