//! A process's device heap: the memory its kernels' `malloc`, `free` and C++ `new`/`delete`
//! draw on. CUDA gives each context one of `CU_LIMIT_MALLOC_HEAP_SIZE` bytes (8 MiB unless the
//! program sets another size before launching a kernel that uses it), allocated when the first
//! such kernel is launched and kept until the context goes. Here the session makes it then,
//! charges it to the VM's slice like any allocation, and gives it back when the process ends.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use vgpu_proto::cuda::{self, limit};

use super::{Session, round_up};
use crate::device::{DeviceError, DeviceHeap, DeviceModule, RunControl};
use crate::error::CuError;

/// `CU_LIMIT_STACK_SIZE`: what `cuCtxGetLimit` answers in the guest (the interpreter sizes
/// stacks itself).
pub const STACK_SIZE_BYTES: u64 = 1024;
/// CUDA's heap size when the program sets none.
pub const DEFAULT_HEAP_BYTES: u64 = 8 << 20;

/// What a process's kernels' device runtime calls use: the heap's size and, once a kernel that
/// uses it was launched, the heap; how many grids kernels may launch and have pending (dynamic
/// parallelism, whose parameter buffers come from the heap); and the device's attributes.
#[derive(Debug)]
pub(super) struct DeviceRuntime {
    size: u64,
    made: Option<Made>,
    /// `CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT`.
    pending_launches: u32,
    /// `CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH`.
    sync_depth: u32,
    /// The device's attributes as the VM sees them, for kernels' `cudaDeviceGetAttribute`
    /// (made at the first launch).
    pub(super) attributes: Option<Arc<[i32]>>,
    /// The context's limits by `CUlimit` number, for kernels' `cudaDeviceGetLimit` (made at a
    /// launch, dropped when a limit changes).
    pub(super) limits: Option<Arc<[u64]>>,
}

struct Made {
    heap: Arc<dyn DeviceHeap>,
    charged: u64,
}

impl std::fmt::Debug for Made {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Made")
            .field("charged", &self.charged)
            .finish()
    }
}

impl Default for DeviceRuntime {
    fn default() -> Self {
        Self {
            size: DEFAULT_HEAP_BYTES,
            made: None,
            pending_launches: limit::DEFAULT_PENDING_LAUNCH_COUNT,
            sync_depth: limit::DEFAULT_SYNC_DEPTH,
            attributes: None,
            limits: None,
        }
    }
}

impl Session {
    /// `cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, bytes)`: the size of the heap the first launch
    /// of a kernel that uses it makes. Refused once it is made (`CUDA_ERROR_INVALID_VALUE`, as
    /// CUDA does) and past the VM's slice (`CUDA_ERROR_OUT_OF_MEMORY`).
    pub(super) fn set_heap_size(&mut self, bytes: u64) -> Result<(), CuError> {
        if self.device_runtime.made.is_some() {
            return Err(CuError::invalid_value(
                "the device heap's size cannot change once a kernel that calls malloc or free was launched",
            ));
        }
        let slice = self.tenant.slice.limit();
        if bytes > slice {
            return Err(CuError::out_of_memory(format!(
                "a device heap of {bytes} bytes does not fit the VM's memory slice of {slice} bytes"
            )));
        }
        self.device_runtime.size = bytes;
        Ok(())
    }

    /// The device's attributes as the VM sees them, shared by its launches.
    pub(super) fn guest_attributes(&mut self) -> Arc<[i32]> {
        let device = &self.device.attributes;
        Arc::clone(
            self.device_runtime
                .attributes
                .get_or_insert_with(|| super::alloc_ext::guest_attributes(device).into()),
        )
    }

    /// Gives `control` what the device runtime calls of kernels of `modules` use: the heap
    /// (made now if one of them uses it), the device runtime's limits and the device's
    /// attributes.
    pub(super) fn set_device_runtime<'m>(
        &mut self,
        control: &RunControl,
        modules: impl IntoIterator<Item = &'m dyn DeviceModule>,
    ) -> Result<(), CuError> {
        let mut heap = None;
        for m in modules {
            heap = heap.or(self.heap_for(m)?);
        }
        control.set_heap(heap);
        control.set_device_attributes(Some(self.guest_attributes()));
        control.set_device_limits(Some(self.device_limits()));
        Ok(())
    }

    /// The context's limits by `CUlimit` number (stack size, printf FIFO, heap, sync depth,
    /// pending launches), as `cuCtxGetLimit` answers them, shared by its launches.
    pub(super) fn device_limits(&mut self) -> Arc<[u64]> {
        let fifo = self.output.fifo_size() as u64;
        let rt = &mut self.device_runtime;
        let (heap, sync_depth, pending) = (rt.size, rt.sync_depth, rt.pending_launches);
        Arc::clone(rt.limits.get_or_insert_with(|| {
            let mut l = [0; limit::COUNT];
            l[limit::STACK_SIZE as usize] = STACK_SIZE_BYTES;
            l[limit::PRINTF_FIFO_SIZE as usize] = fifo;
            l[limit::MALLOC_HEAP_SIZE as usize] = heap;
            l[limit::DEV_RUNTIME_SYNC_DEPTH as usize] = u64::from(sync_depth);
            l[limit::DEV_RUNTIME_PENDING_LAUNCH_COUNT as usize] = u64::from(pending);
            l.into()
        }))
    }

    /// `cuCtxSetLimit(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, n)`: 1 to
    /// [`limit::MAX_PENDING_LAUNCH_COUNT`] grids launched by kernels and not yet run.
    pub(super) fn set_pending_launches(&mut self, n: u64) -> Result<(), CuError> {
        match u32::try_from(n) {
            Ok(n) if (1..=limit::MAX_PENDING_LAUNCH_COUNT).contains(&n) => {
                self.device_runtime.pending_launches = n;
                Ok(())
            }
            _ => Err(CuError::invalid_value(format!(
                "a pending launch count of {n}: vgpud allows 1 to {}",
                limit::MAX_PENDING_LAUNCH_COUNT
            ))),
        }
    }

    /// `cuCtxSetLimit(CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, n)`: grids nested less than `n` deep
    /// may wait for their children (CUDA 11's device-side `cudaDeviceSynchronize`); 0 to
    /// [`limit::MAX_DEPTH`].
    pub(super) fn set_sync_depth(&mut self, n: u64) -> Result<(), CuError> {
        match u32::try_from(n) {
            Ok(n) if n <= limit::MAX_DEPTH => {
                self.device_runtime.sync_depth = n;
                Ok(())
            }
            _ => Err(CuError::invalid_value(format!(
                "a sync depth of {n}: grids nest at most {} deep",
                limit::MAX_DEPTH
            ))),
        }
    }

    /// The heap for a launch of a kernel of `module`: made (and charged) at the first launch of
    /// a kernel that uses it; `None` before (kernels that do not use it need none) and for a
    /// heap of 0 bytes (their `malloc` answers `NULL`).
    pub(super) fn heap_for(
        &mut self,
        module: &dyn DeviceModule,
    ) -> Result<Option<Arc<dyn DeviceHeap>>, CuError> {
        if let Some(m) = &self.device_runtime.made {
            return Ok(Some(Arc::clone(&m.heap)));
        }
        if !module.uses_heap() || self.device_runtime.size == 0 {
            return Ok(None);
        }
        let size = self.device_runtime.size;
        let charged = round_up(size, self.device.alloc_granularity).unwrap_or(size);
        self.tenant.slice.charge(charged).map_err(|_| {
            CuError::out_of_memory(format!(
                "the device heap of {size} bytes (CU_LIMIT_MALLOC_HEAP_SIZE) does not fit the memory slice"
            ))
        })?;
        let heap = match self.dev.heap_create(size) {
            Ok(h) => h,
            Err(e) => {
                self.tenant.slice.refund(charged);
                return Err(match e {
                    DeviceError::OutOfMemory => CuError::out_of_memory(
                        "the device has no room for the device heap (CU_LIMIT_MALLOC_HEAP_SIZE)",
                    ),
                    DeviceError::NotSupported(why) => {
                        CuError::new(cuda::CUDA_ERROR_NOT_SUPPORTED, why)
                    }
                    e => e.into(),
                });
            }
        };
        self.device_runtime.made = Some(Made {
            heap: Arc::clone(&heap),
            charged,
        });
        self.note_memory();
        Ok(Some(heap))
    }

    /// Publishes the bytes of the slice the process holds (its allocations and its heap), as
    /// `vgpuctl` and `vgpu-smi` show them.
    pub(super) fn note_memory(&self) {
        let heap = self.device_runtime.made.as_ref().map_or(0, |m| m.charged);
        self.info
            .memory
            .store(self.allocs.charged() + heap, Ordering::Relaxed);
    }

    /// The process ended: its heap goes (freed once the last launch holding it ends) and its
    /// bytes go back to the slice.
    pub(super) fn release_heap(&mut self) {
        if let Some(m) = self.device_runtime.made.take() {
            self.tenant.slice.refund(m.charged);
        }
    }
}
