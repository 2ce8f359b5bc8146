//! One VM's view of a GPU ([`CudaContext`]), the broker's `DeviceContext` on a real GPU: it
//! routes each call to the VM's live CUDA context generation ([`crate::context`]), creating a
//! fresh one after a sticky error, and loads modules into it ([`crate::module`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::debug;
use vgpu_broker::device::{
    ChainKernel, DeviceContext, DeviceError, DeviceHeap, DeviceModule, LaunchDims, LaunchProgress,
    Residence, RunControl, pieces_len,
};
use vgpu_broker::texture::{TexSampling, TexelLayout};
use vgpu_proto::cuda;

use crate::context::{
    ALLOC_GRANULARITY, ContextInner, DeviceShared, KernelTimes, Range, RangeKind, STAGING_CHUNK,
    lock, round_up,
};
use crate::error::Op;
use crate::module::CudaModule;

mod vmm;

/// How an allocation of a VM was made (see `context/movable.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocPath {
    /// `cuMemAlloc`: smaller than the movable granularity, or no virtual memory management on
    /// this GPU; it cannot move.
    MemAlloc,
    /// Its own reserved range mapped to `cuMemCreate` memory, now at this residence; it can
    /// move between device and host memory under the same address.
    Movable(Residence),
}

/// One VM's view of a GPU: its own CUDA context (recreated after a sticky error).
pub struct CudaContext {
    inner: Arc<ContextInner>,
}

impl std::fmt::Debug for CudaContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaContext")
            .field("tenant", &self.inner.tenant)
            .field("generation", &self.inner.existing())
            .finish()
    }
}

impl CudaContext {
    /// Opens the context of `tenant` (creates its `CUcontext` now).
    pub(crate) fn new(
        shared: &Arc<DeviceShared>,
        tenant: &str,
    ) -> Result<CudaContext, DeviceError> {
        let inner = Arc::new(ContextInner::new(shared, tenant));
        inner.generation()?;
        Ok(CudaContext { inner })
    }

    /// The error that made the VM's current context unusable, if any. The
    /// broker can use it to give a VM's next session a fresh context at once
    /// (see docs/cuda.md).
    pub fn broken(&self) -> Option<DeviceError> {
        self.inner.existing().and_then(|g| g.broken())
    }

    /// How many `CUcontext`s this VM has had (1 until a sticky error).
    pub fn generations(&self) -> u64 {
        self.inner.generations.load(Ordering::Relaxed)
    }

    /// How the allocation at `ptr` was made and where it is; `None` for an address that is no
    /// allocation's start.
    pub fn alloc_path(&self, ptr: u64) -> Option<AllocPath> {
        let g = self.inner.existing()?;
        if let Some(r) = g.movable_residence(ptr) {
            return Some(AllocPath::Movable(r));
        }
        lock(&g.ranges)
            .get(&ptr)
            .filter(|r| matches!(r.kind, RangeKind::Alloc | RangeKind::AllocAt(_)))
            .map(|_| AllocPath::MemAlloc)
    }

    /// A `cuMemAlloc` allocation (never movable), zeroed.
    fn alloc_fixed(&self, size: u64) -> Result<u64, DeviceError> {
        let g = self.inner.generation()?;
        let p = {
            let _c = g.enter()?;
            let d = g.driver();
            let p = d.mem_alloc(size).map_err(|f| g.fail(f, Op::Other))?;
            // `cuMemAlloc` memory is uninitialised and may hold what another VM freed: zero it
            // before the VM can use it (its work runs on several streams: wait for the fill).
            let len = usize::try_from(size).unwrap_or(usize::MAX);
            if let Err(f) = d.memset_async(p, 0, 1, len, g.stream) {
                let e = g.fail(f, Op::Other);
                let _ = d.mem_free(p);
                return Err(e);
            }
            p
        };
        if let Err(e) = g.finish_on(g.stream) {
            if g.broken().is_none()
                && let Ok(_c) = g.enter()
            {
                let _ = g.driver().mem_free(p);
            }
            return Err(e);
        }
        let charged = round_up(size.max(1), ALLOC_GRANULARITY);
        lock(&g.ranges).insert(
            p,
            Range {
                size,
                charged,
                kind: RangeKind::Alloc,
            },
        );
        g.shared.used.fetch_add(charged, Ordering::Relaxed);
        Ok(p)
    }

    /// GPU time of the VM's kernels.
    pub fn kernel_times(&self) -> &KernelTimes {
        &self.inner.times
    }

    /// How many executable graphs of chains of kernels the VM's context keeps now
    /// ([`crate::chain`]).
    pub fn cached_graphs(&self) -> usize {
        self.inner.existing().map_or(0, |g| lock(&g.graphs).len())
    }

    /// Non-zero bytes in the VM's idle staging buffers: 0, since every copy clears what it left
    /// in its buffer before the buffer goes back to the pool (see `clear_staging`). For tests.
    pub fn staging_bytes_at_rest(&self) -> usize {
        let Some(g) = self.inner.existing() else {
            return 0;
        };
        lock(&g.staging)
            .iter()
            .map(|st| {
                // SAFETY: a pooled (idle) buffer of 2 * STAGING_CHUNK bytes: no copy uses it
                // while the pool's lock is held, and it is only read here.
                let bytes = unsafe { std::slice::from_raw_parts(st.buf.0, 2 * STAGING_CHUNK) };
                bytes.iter().filter(|&&b| b != 0).count()
            })
            .sum()
    }
}

/// `CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH` and `CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT`, in the
/// order of [`crate::context::Generation::device_runtime_limits`].
const DEVICE_RUNTIME_LIMITS: [u32; 2] = [
    cuda::limit::DEV_RUNTIME_SYNC_DEPTH,
    cuda::limit::DEV_RUNTIME_PENDING_LAUNCH_COUNT,
];

/// Raises the current context's `limit` to `want` when it is below (never lowers it).
fn raise_limit(d: &crate::driver::Driver, limit: u32, want: u64) -> crate::driver::DrvResult<()> {
    let limit = limit as std::ffi::c_int;
    if want > d.ctx_get_limit(limit)? {
        d.ctx_set_limit(limit, want)?;
    }
    Ok(())
}

/// Raises the VM context's device runtime limits to what `control`'s process set, when it set
/// more than the VM's processes did so far: the context is the VM's, so each limit is the
/// largest any of them asked for (the broker bounds them). A limit the driver refuses to change
/// (it may once kernels launched kernels) stays as it is.
fn raise_device_runtime_limits(g: &crate::context::Generation, control: &RunControl) {
    let Some(limits) = control.device_limits() else {
        return;
    };
    let wanted = DEVICE_RUNTIME_LIMITS.map(|l| limits.get(l as usize).copied().unwrap_or(0));
    let mut raised = lock(&g.device_runtime_limits);
    for ((&limit, &want), now) in DEVICE_RUNTIME_LIMITS
        .iter()
        .zip(&wanted)
        .zip(raised.iter_mut())
    {
        if want <= *now {
            continue;
        }
        *now = want;
        if let Err(f) = raise_limit(g.driver(), limit, want) {
            debug!(
                call = f.call,
                code = f.code,
                limit,
                want,
                "a device runtime limit keeps its value"
            );
        }
    }
}

/// A process's share of the VM context's device heap, which the driver holds.
struct CudaHeap;

impl DeviceHeap for CudaHeap {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl DeviceContext for CudaContext {
    fn health(&self) -> Result<(), DeviceError> {
        self.broken().map_or(Ok(()), Err)
    }

    fn alloc(&self, size: u64) -> Result<u64, DeviceError> {
        let g = self.inner.generation()?;
        if g.movable_size(size) {
            match g.alloc_movable(size, Residence::Device) {
                Ok(p) => return Ok(p),
                Err(DeviceError::OutOfMemory) => return Err(DeviceError::OutOfMemory),
                Err(e) if g.broken().is_some() => return Err(e),
                Err(e) => {
                    debug!(error = %e, size, "a movable allocation failed; using cuMemAlloc");
                }
            }
        }
        drop(g);
        self.alloc_fixed(size)
    }

    fn alloc_host(&self, size: u64) -> Result<u64, DeviceError> {
        let g = self.inner.generation()?;
        if !g.movable_size(size) {
            let unit = g.shared.movable.map_or(0, |c| c.granularity);
            return Err(DeviceError::NotSupported(
                if let Some(why) = g.shared.vmm_isolation.refusal() {
                    format!("{why}, so no allocation can live in host memory")
                } else if unit == 0 {
                    "this GPU or driver has no virtual memory management, so no allocation can \
                 live in host memory"
                        .into()
                } else {
                    format!(
                        "only allocations of at least {unit} bytes can live in host memory on a \
                     real GPU (each takes whole {unit}-byte chunks)"
                    )
                },
            ));
        }
        g.alloc_movable(size, Residence::Host)
    }

    fn migrate(&self, ptr: u64, to: Residence) -> Result<(), DeviceError> {
        let g = self.inner.generation()?;
        if g.movable_residence(ptr).is_none() {
            return Err(match lock(&g.ranges).get(&ptr).map(|r| r.kind) {
                Some(RangeKind::Alloc | RangeKind::AllocAt(_)) => DeviceError::NotSupported(
                    "this allocation is cuMemAlloc memory (smaller than the movable \
                     granularity, or made without virtual memory management) and cannot move"
                        .into(),
                ),
                _ => DeviceError::InvalidAddress { addr: ptr, len: 0 },
            });
        }
        g.move_movable(ptr, to)
    }

    fn free(&self, ptr: u64) -> Result<(), DeviceError> {
        let g = self
            .inner
            .existing()
            .ok_or(DeviceError::InvalidAddress { addr: ptr, len: 0 })?;
        // Not while the allocation moves (the broker may free it meanwhile).
        let work = g.work_gate();
        let r = {
            let mut ranges = lock(&g.ranges);
            match ranges.get(&ptr) {
                Some(r)
                    if matches!(
                        r.kind,
                        RangeKind::Alloc | RangeKind::AllocAt(_) | RangeKind::Movable
                    ) => {}
                _ => return Err(DeviceError::InvalidAddress { addr: ptr, len: 0 }),
            }
            ranges.remove(&ptr)
        };
        let mut base = ptr;
        if let Some(r) = r {
            g.shared.used.fetch_sub(r.charged, Ordering::Relaxed);
            match r.kind {
                RangeKind::AllocAt(b) => base = b,
                RangeKind::Movable => {
                    g.free_movable(ptr);
                    drop(work);
                    drop(g);
                    self.inner.retire_if_idle();
                    return Ok(());
                }
                _ => {}
            }
        }
        let ptr = base;
        // A broken context frees nothing one by one: destroying it frees everything.
        if g.broken().is_none() {
            let res = g
                .enter()
                .and_then(|_c| g.driver().mem_free(ptr).map_err(|f| g.fail(f, Op::Other)));
            if let Err(e) = res {
                debug!(error = %e, "cuMemFree failed; the memory is freed with the context");
            }
        }
        drop(work);
        drop(g);
        self.inner.retire_if_idle();
        Ok(())
    }

    fn alloc_aligned(&self, size: u64, align: u64) -> Result<u64, DeviceError> {
        if align <= 256 {
            return self.alloc_fixed(size);
        }
        if !align.is_power_of_two() || align > 1 << 30 {
            return Err(DeviceError::NotSupported(format!(
                "allocation alignment {align} is not a power of two up to 1 GiB"
            )));
        }
        // Room to move up to an aligned address inside one allocation.
        let total = size
            .checked_add(align - 1)
            .ok_or(DeviceError::OutOfMemory)?;
        // cuMemAlloc memory: mirrored kinds never move.
        let base = self.alloc_fixed(total)?;
        let at = (base + align - 1) & !(align - 1);
        let g = self.inner.generation()?;
        let mut ranges = lock(&g.ranges);
        if let Some(r) = ranges.remove(&base) {
            ranges.insert(
                at,
                Range {
                    size,
                    charged: r.charged,
                    kind: RangeKind::AllocAt(base),
                },
            );
        }
        Ok(at)
    }

    fn phys_create(&self, size: u64) -> Result<u64, DeviceError> {
        self.vmm_phys_create(size)
    }

    fn phys_release(&self, id: u64) -> Result<(), DeviceError> {
        self.vmm_phys_release(id)
    }

    fn va_reserve(&self, size: u64, align: u64) -> Result<u64, DeviceError> {
        self.vmm_reserve(size, align)
    }

    fn va_free(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        self.vmm_free(addr, size)
    }

    fn map(&self, va: u64, size: u64, id: u64) -> Result<(), DeviceError> {
        self.vmm_map(va, size, id)
    }

    fn unmap(&self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.vmm_unmap(va, size)
    }

    fn write(&self, dst: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.write_gathered(dst, &[data])
    }

    fn read(&self, src: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        self.read_scattered(src, &mut [out])
    }

    fn write_gathered(&self, dst: u64, pieces: &[&[u8]]) -> Result<(), DeviceError> {
        let total = pieces_len(dst, pieces.iter().map(|p| p.len()))?;
        let g = self.inner.generation()?;
        let _work = g.work_gate();
        g.check_range(dst, total)?;
        if total == 0 {
            return Ok(());
        }
        g.write_gathered(dst, pieces, total)
    }

    fn read_scattered(&self, src: u64, pieces: &mut [&mut [u8]]) -> Result<(), DeviceError> {
        let total = pieces_len(src, pieces.iter().map(|p| p.len()))?;
        let g = self.inner.generation()?;
        let _work = g.work_gate();
        g.check_range(src, total)?;
        if total == 0 {
            return Ok(());
        }
        g.read_scattered(src, pieces, total)
    }

    fn copy(&self, dst: u64, src: u64, len: u64) -> Result<(), DeviceError> {
        let g = self.inner.generation()?;
        let _work = g.work_gate();
        g.check_range(src, len)?;
        g.check_range(dst, len)?;
        g.copy(dst, src, len)
    }

    fn memset(&self, dst: u64, value: u32, elem_size: u32, count: u64) -> Result<(), DeviceError> {
        let bytes = vgpu_broker::device::memset_len(dst, elem_size, count)?;
        let g = self.inner.generation()?;
        let _work = g.work_gate();
        g.check_range(dst, bytes)?;
        g.memset(dst, value, elem_size, count)
    }

    fn load_module(
        &self,
        image: &[u8],
        budget: u64,
        control: &RunControl,
    ) -> Result<Arc<dyn DeviceModule>, DeviceError> {
        // The driver's JIT cannot be interrupted: a load that runs past the deadline is
        // abandoned to a loader thread (`crate::loader`); one already past it does not start.
        if control.poll_cancelled() || control.past_deadline() {
            return Err(DeviceError::LoadStopped(
                "the module load was cancelled before it started".into(),
            ));
        }
        let g = self.inner.generation()?;
        let m = CudaModule::load(&self.inner, g, image, budget, control)?;
        Ok(Arc::new(m))
    }

    fn launch(
        &self,
        module: &dyn DeviceModule,
        kernel: usize,
        dims: &LaunchDims,
        params: &[u8],
        start_block: u64,
        control: &RunControl,
    ) -> Result<LaunchProgress, DeviceError> {
        let m = module
            .as_any()
            .downcast_ref::<CudaModule>()
            .ok_or_else(|| DeviceError::NotSupported("module of another device".into()))?;
        if start_block != 0 {
            return Err(DeviceError::InvalidLaunch {
                code: cuda::CUDA_ERROR_INVALID_VALUE,
                message: "a real GPU runs whole grids: launches cannot resume from a block".into(),
            });
        }
        let g = m.generation()?;
        // Held until the kernel completed: a move of an allocation waits for it.
        let _work = g.work_gate();
        if m.launches_kernels() {
            let _c = g.enter()?;
            raise_device_runtime_limits(&g, control);
        }
        let (f, name) = m.function(kernel)?;
        m.ensure_dynamic_shared(kernel, dims.shared_bytes)?;
        let (start, end) = g.take_event_pair()?;
        let stream = g.lane_stream();
        // The engine's priority for this job (lower first; 0 takes the stream's own).
        // Cooperative launches keep their stream's priority.
        let priority = vgpu_broker::device::current_priority();
        let issued = (|| {
            let _order = lock(&g.submit);
            let _c = g.enter()?;
            let d = g.driver();
            d.event_record(start, stream)
                .map_err(|f| g.fail(f, Op::Other))?;
            if dims.cooperative {
                let offsets = &m
                    .kernels()
                    .get(kernel)
                    .ok_or_else(|| DeviceError::NotSupported(format!("no kernel #{kernel}")))?
                    .param_offsets;
                d.launch_cooperative(
                    f,
                    dims.grid,
                    dims.block,
                    dims.shared_bytes,
                    stream,
                    params,
                    offsets,
                )
            } else {
                d.launch(
                    f,
                    dims.grid,
                    dims.block,
                    dims.shared_bytes,
                    stream,
                    params,
                    priority,
                )
            }
            .map_err(|f| g.fail(f, Op::Launch))?;
            d.event_record(end, stream)
                .map_err(|f| g.fail(f, Op::Other))
        })();
        if let Err(e) = issued {
            g.abandon_launch(start, end);
            return Err(e);
        }
        let waited = g.wait(end, control.deadline(), Some((control, name)));
        if let Some(b) = m.printf_buffer() {
            // This launch's printf text goes to this launch's output, whatever its outcome.
            if let Err(e) = g.take_printf(b, control) {
                debug!(kernel = %name, error = %e, "reading back the kernel's printf buffer failed");
            }
        }
        let t = g.launch_time((start, end), waited, control, &format!("kernel `{name}`"))?;
        self.inner.times.record(t);
        Ok(LaunchProgress::Completed)
    }

    /// The VM's CUDA context has one heap, which the driver allocates at the first launch of a
    /// kernel that uses it: its size is raised to the largest any process of the VM asked for
    /// until then (the broker charged each process its own). Past that launch the driver keeps
    /// the size it has.
    fn heap_create(&self, size: u64) -> Result<Arc<dyn DeviceHeap>, DeviceError> {
        let g = self.inner.generation()?;
        let _c = g.enter()?;
        if let Err(f) = raise_limit(g.driver(), cuda::limit::MALLOC_HEAP_SIZE, size) {
            debug!(
                call = f.call,
                code = f.code,
                size,
                "the device heap keeps its size"
            );
        }
        Ok(Arc::new(CudaHeap))
    }

    fn launch_chain(
        &self,
        kernels: &[ChainKernel<'_>],
        control: &RunControl,
    ) -> Result<(), DeviceError> {
        let Some(first) = kernels.first() else {
            // The broker's probe: whether chains can run here at all.
            return if self.inner.shared.driver.has_graphs() {
                Ok(())
            } else {
                Err(DeviceError::NotSupported(
                    "the CUDA driver has no stream capture or graphs".into(),
                ))
            };
        };
        let m = first
            .module
            .as_any()
            .downcast_ref::<CudaModule>()
            .ok_or_else(|| DeviceError::NotSupported("module of another device".into()))?;
        let g = m.generation()?;
        for k in &kernels[1..] {
            let same = k
                .module
                .as_any()
                .downcast_ref::<CudaModule>()
                .and_then(|m| m.generation().ok())
                .is_some_and(|mg| Arc::ptr_eq(&mg, &g));
            if !same {
                return Err(DeviceError::NotSupported(
                    "the chain's modules live in different CUDA contexts".into(),
                ));
            }
        }
        // Held until the chain completed: a move of an allocation waits for it.
        let _work = g.work_gate();
        let t = crate::chain::launch(&g, kernels, control)?;
        self.inner.times.record_chain(t, kernels.len() as u64);
        Ok(())
    }

    fn texture_create(
        &self,
        layout: &TexelLayout,
        sampling: &TexSampling,
    ) -> Result<u64, DeviceError> {
        if sampling.mip.levels > 1 {
            return Err(DeviceError::NotSupported(
                "mipmapped textures need CUDA mipmapped arrays, which the CUDA device does not \
                 create yet"
                    .into(),
            ));
        }
        let res = crate::texture_abi::resource(layout).ok_or_else(|| {
            DeviceError::NotSupported(
                "three-dimensional and layered textures need CUDA arrays, which the CUDA device \
                 does not create yet"
                    .into(),
            )
        })?;
        let tex = crate::texture_abi::texture(sampling);
        let g = self.inner.generation()?;
        let _c = g.enter()?;
        g.driver()
            .tex_object_create(&res, &tex)
            .map_err(|f| g.fail(f, Op::Other))
    }

    fn texture_destroy(&self, handle: u64) -> Result<(), DeviceError> {
        let g = self.inner.generation()?;
        let _c = g.enter()?;
        g.driver()
            .tex_object_destroy(handle)
            .map_err(|f| g.fail(f, Op::Other))
    }

    fn surface_create(&self, _layout: &TexelLayout) -> Result<u64, DeviceError> {
        Err(DeviceError::NotSupported(
            "surface objects need CUDA arrays, which the CUDA device does not create yet".into(),
        ))
    }
}
