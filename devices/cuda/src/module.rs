//! Modules in a VM's CUDA context: the guest's PTX, cubin or fat binary
//! loaded with `cuModuleLoadDataEx`, its kernels with their parameter
//! layouts and attributes, and its globals with the addresses the driver
//! gave them (charged to the VM's slice by the broker).

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use tracing::{debug, warn};
use vgpu_broker::device::{DeviceError, DeviceModule, GlobalDesc, KernelDesc, RunControl};
use vgpu_proto::cuda::{self, attr, func_attr};

use crate::context::{ALLOC_GRANULARITY, ContextInner, Generation};
use crate::driver::{Function, ListedKernel, Module};
use crate::error::Op;
use crate::image::{self, Kind};
use crate::loader::LoadStop;
use crate::printf::{self, PrintfBuffer};

fn charge(size: u64) -> u64 {
    size.max(1)
        .div_ceil(ALLOC_GRANULARITY)
        .saturating_mul(ALLOC_GRANULARITY)
}

/// A module loaded in a VM's context. Dropping it unloads it.
pub struct CudaModule {
    owner: Arc<ContextInner>,
    generation: Option<Arc<Generation>>,
    module: Module,
    kernels: Vec<KernelDesc>,
    functions: Vec<Function>,
    /// The dynamic shared memory limit each function has on the device now.
    dynamic_shared: Vec<AtomicI32>,
    globals: Vec<GlobalDesc>,
    /// Its printf buffer, when the image was rewritten to return `printf` text.
    printf: Option<PrintfBuffer>,
    /// Whether its kernels may call the device heap.
    heap: bool,
    /// Whether its kernels may launch kernels.
    launches: bool,
}

impl std::fmt::Debug for CudaModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaModule")
            .field("kernels", &self.kernels.len())
            .field("globals", &self.globals.len())
            .field("printf", &self.printf.is_some())
            .finish()
    }
}

impl CudaModule {
    /// Loads `image` in generation `g`, refusing it with `OutOfMemory` when
    /// its globals need more than `budget` bytes. The driver's load runs on a loader thread
    /// ([`crate::loader`]): past `control`'s deadline, or when its client is gone, it is
    /// abandoned (unloaded when it ends) and this returns [`DeviceError::LoadStopped`].
    pub(crate) fn load(
        owner: &Arc<ContextInner>,
        g: Arc<Generation>,
        image: &[u8],
        budget: u64,
        control: &RunControl,
    ) -> Result<CudaModule, DeviceError> {
        let mut prepared =
            image::prepare_for(image, device_arch(&g)).map_err(|e| DeviceError::InvalidImage {
                code: cuda::CUDA_ERROR_INVALID_IMAGE,
                message: e.to_string(),
            })?;
        // What the image declares is known before the driver allocates
        // anything: refuse early when that alone exceeds the budget.
        let declared: u64 = prepared
            .decls
            .variables
            .iter()
            .map(|v| charge(v.size))
            .fold(0, u64::saturating_add);
        if declared > budget {
            return Err(DeviceError::OutOfMemory);
        }
        let bytes = std::mem::take(&mut prepared.bytes);
        let lg = Arc::clone(&g);
        let load = move || -> Result<Module, DeviceError> {
            let _c = lg.enter()?;
            lg.driver().module_load(&bytes).map_err(|(f, log)| {
                let e = lg.fail(f, Op::Load);
                match e {
                    DeviceError::InvalidImage { code, message } if !log.is_empty() => {
                        DeviceError::InvalidImage {
                            code,
                            message: format!("{message}: {log}"),
                        }
                    }
                    e => e,
                }
            })
        };
        let dg = Arc::clone(&g);
        let discard = move |loaded: Result<Module, DeviceError>| {
            // Nothing else knows of this module: unloading it here is its only unload.
            if let Ok(m) = loaded {
                let r = dg.enter().and_then(|_c| {
                    dg.driver()
                        .module_unload(m)
                        .map_err(|f| dg.fail(f, Op::Other))
                });
                if let Err(e) = r {
                    debug!(error = %e, "unloading an abandoned module failed; it goes with its context");
                }
            }
        };
        let module = owner
            .loader
            .run(
                control.deadline(),
                || control.poll_cancelled(),
                load,
                discard,
            )
            .map_err(|stop| match stop {
                LoadStop::Spawn => DeviceError::OutOfMemory,
                stop => DeviceError::LoadStopped(stop.to_string()),
            })??;
        // From here on, dropping `m` unloads the module.
        let mut m = CudaModule {
            owner: Arc::clone(owner),
            generation: Some(Arc::clone(&g)),
            module,
            kernels: Vec::new(),
            functions: Vec::new(),
            dynamic_shared: Vec::new(),
            globals: Vec::new(),
            printf: None,
            heap: prepared.heap,
            launches: prepared.launches,
        };
        m.read_kernels(&g, &prepared)?;
        m.read_globals(&g, &prepared)?;
        if prepared.printf {
            m.printf = m.find_printf_buffer();
        }
        let total: u64 = m.globals.iter().map(|x| charge(x.size)).sum();
        if total > budget {
            return Err(DeviceError::OutOfMemory);
        }
        for x in &m.globals {
            g.add_global(x.addr, x.size, charge(x.size));
        }
        debug!(
            kind = ?prepared.kind,
            kernels = m.kernels.len(),
            globals = m.globals.len(),
            printf = m.printf.is_some(),
            "module loaded"
        );
        Ok(m)
    }

    /// The printf buffer among its globals (both are `.visible`, so found by name; a module
    /// where they are missing or too small prints nothing back).
    fn find_printf_buffer(&self) -> Option<PrintfBuffer> {
        let find = |name: &str, size: usize| {
            self.globals
                .iter()
                .find(|x| x.name == name && x.size >= size as u64)
                .map(|x| x.addr)
        };
        let b = PrintfBuffer {
            head: find(printf::HEAD_SYMBOL, printf::HEAD_SIZE)?,
            buf: find(printf::BUFFER_SYMBOL, printf::BUFFER_SIZE)?,
        };
        Some(b)
    }

    /// Its printf buffer, when its `printf` text is returned.
    pub(crate) fn printf_buffer(&self) -> Option<PrintfBuffer> {
        self.printf
    }

    fn read_kernels(
        &mut self,
        g: &Generation,
        prepared: &image::Prepared,
    ) -> Result<(), DeviceError> {
        let d = g.driver();
        let _c = g.enter()?;
        let listed: Vec<ListedKernel> = match d.enumerate_kernels(self.module) {
            Some(r) => r.map_err(|f| g.fail(f, Op::Load))?,
            None => {
                let mut v = Vec::new();
                for e in &prepared.decls.entries {
                    match d.module_function(self.module, &e.name) {
                        Ok(f) => v.push((
                            e.name.clone(),
                            f,
                            e.params.iter().map(|p| (p.offset, p.size)).collect(),
                        )),
                        Err(f) if f.code == cuda::CUDA_ERROR_NOT_FOUND => {
                            warn!(kernel = %e.name, "the image declares a kernel the driver does not know; skipped");
                        }
                        Err(f) => return Err(g.fail(f, Op::Load)),
                    }
                }
                if v.is_empty() && prepared.kind == Kind::Fatbin {
                    debug!(
                        "no kernels readable from a compressed fat binary on a driver older than CUDA 12.4"
                    );
                }
                v
            }
        };
        for (name, f, params) in listed {
            let mut attributes = vec![0; func_attr::COUNT];
            for (a, slot) in attributes.iter_mut().enumerate() {
                // Attributes this driver does not know stay 0.
                *slot = d.func_attribute(f, a as i32).unwrap_or(0);
            }
            self.dynamic_shared.push(AtomicI32::new(
                attributes[func_attr::MAX_DYNAMIC_SHARED_SIZE_BYTES],
            ));
            self.kernels.push(KernelDesc {
                name,
                param_offsets: params.iter().map(|p| p.0).collect(),
                param_sizes: params.iter().map(|p| p.1).collect(),
                attributes,
                runnable: true,
            });
            self.functions.push(f);
        }
        Ok(())
    }

    fn read_globals(
        &mut self,
        g: &Generation,
        prepared: &image::Prepared,
    ) -> Result<(), DeviceError> {
        let d = g.driver();
        let _c = g.enter()?;
        for v in &prepared.decls.variables {
            match d.module_global(self.module, &v.name) {
                Ok((addr, size)) => {
                    if !self.globals.iter().any(|x| x.addr == addr) {
                        self.globals.push(GlobalDesc {
                            name: v.name.clone(),
                            addr,
                            size,
                            managed: v.managed,
                            reference: None,
                        });
                    }
                }
                // Internal (non-visible) variables may not be addressable by name.
                Err(f) if f.code == cuda::CUDA_ERROR_NOT_FOUND => {
                    debug!(global = %v.name, "module variable not addressable by name");
                }
                Err(f) => return Err(g.fail(f, Op::Load)),
            }
        }
        Ok(())
    }

    /// The generation it lives in, if still usable.
    pub(crate) fn generation(&self) -> Result<Arc<Generation>, DeviceError> {
        let g = self
            .generation
            .as_ref()
            .ok_or_else(|| DeviceError::NotSupported("the module was unloaded".into()))?;
        match g.broken() {
            Some(e) => Err(e),
            None => Ok(Arc::clone(g)),
        }
    }

    /// The function and name of kernel `i`.
    pub(crate) fn function(&self, i: usize) -> Result<(Function, &str), DeviceError> {
        match (self.functions.get(i), self.kernels.get(i)) {
            (Some(f), Some(k)) => Ok((*f, &k.name)),
            _ => Err(DeviceError::NotSupported(format!("no kernel #{i}"))),
        }
    }

    /// Raises kernel `i`'s dynamic shared memory limit on the device when a
    /// launch needs more than it has (the broker validated the amount
    /// against the limit the guest set with `cuFuncSetAttribute`).
    pub(crate) fn ensure_dynamic_shared(&self, i: usize, bytes: u32) -> Result<(), DeviceError> {
        let (Some(cur), Some(f)) = (self.dynamic_shared.get(i), self.functions.get(i)) else {
            return Ok(());
        };
        let want = i32::try_from(bytes).unwrap_or(i32::MAX);
        if want <= cur.load(Ordering::Relaxed) {
            return Ok(());
        }
        let g = self.generation()?;
        let _c = g.enter()?;
        g.driver()
            .func_set_attribute(*f, func_attr::MAX_DYNAMIC_SHARED_SIZE_BYTES as i32, want)
            .map_err(|e| g.fail(e, Op::Launch))?;
        cur.fetch_max(want, Ordering::Relaxed);
        Ok(())
    }
}

/// The architecture of the generation's GPU (80 for compute capability 8.0), which picks the
/// PTX of a fat binary the driver would JIT-compile; `None` when the driver does not say.
fn device_arch(g: &Generation) -> Option<u32> {
    let d = g.driver();
    let dev = g.shared.dev;
    let major = d
        .device_attribute(dev, attr::COMPUTE_CAPABILITY_MAJOR as i32)
        .ok()?;
    let minor = d
        .device_attribute(dev, attr::COMPUTE_CAPABILITY_MINOR as i32)
        .ok()?;
    u32::try_from(major * 10 + minor).ok()
}

impl DeviceModule for CudaModule {
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
        self.globals.iter().map(|g| charge(g.size)).sum()
    }

    fn uses_heap(&self) -> bool {
        self.heap
    }
}

impl CudaModule {
    /// Whether its kernels may launch kernels (dynamic parallelism).
    pub(crate) fn launches_kernels(&self) -> bool {
        self.launches
    }
}

impl Drop for CudaModule {
    fn drop(&mut self) {
        let Some(g) = self.generation.take() else {
            return;
        };
        for x in &self.globals {
            g.remove_global(x.addr);
        }
        // A broken context unloads nothing one by one.
        if g.broken().is_none() {
            let r = g.enter().and_then(|_c| {
                // Cached graphs that launch its kernels go first.
                crate::context::lock(&g.graphs).forget(g.driver(), &self.functions);
                g.driver()
                    .module_unload(self.module)
                    .map_err(|f| g.fail(f, Op::Other))
            });
            if let Err(e) = r {
                debug!(error = %e, "cuModuleUnload failed; the module goes with its context");
            }
        }
        drop(g);
        self.owner.retire_if_idle();
    }
}
