//! The device runtime's calls for dynamic parallelism (`cnpGetParameterBufferV2`,
//! `cnpLaunchDeviceV2`, `cnpGetLastError`, `cnpSetLastError`), for the lanes of a warp in lane
//! order; what they record is in [`crate::devlaunch`].

use super::*;
use crate::devlaunch::{ChildGrid, PARAM_BUFFER_ALIGN, cnp};

/// The bytes of one lane's `.param` argument `i` of builtin call `b` (none when it has no such
/// argument).
pub(super) fn arg_bytes<'f>(frame: &'f Frame, b: &BuiltinCall, l: usize, i: usize) -> &'f [u8] {
    let Some(&(off, size)) = b.args.get(i) else {
        return &[];
    };
    let s = l * frame.param_bytes + off as usize;
    frame.params.get(s..s + size as usize).unwrap_or(&[])
}

/// A `dim3` passed by value (12 bytes).
fn dim3(b: &[u8]) -> [u32; 3] {
    let w = |i: usize| {
        b.get(i * 4..i * 4 + 4)
            .map_or(0, |x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
    };
    [w(0), w(1), w(2)]
}

/// A device runtime error as `codes` says.
fn in_codes(e: u32, codes: ErrorCodes) -> u32 {
    match codes {
        ErrorCodes::Cnp => e,
        ErrorCodes::Cuda => cnp::to_cuda(e),
    }
}

impl<'a> Worker<'a> {
    pub(super) fn device_runtime(&mut self, warp: &mut Warp, b: &BuiltinCall, m: u32) {
        let mut rets = [0u64; 32];
        for l in 0..32 {
            if m >> l & 1 == 0 {
                continue;
            }
            let Some(frame) = warp.frames.last() else {
                return;
            };
            rets[l] = match b.kind {
                Builtin::GetParameterBuffer => self.parameter_buffer(
                    read_le(arg_bytes(frame, b, l, 0)),
                    dim3(arg_bytes(frame, b, l, 1)),
                    dim3(arg_bytes(frame, b, l, 2)),
                    read_le(arg_bytes(frame, b, l, 3)) as u32,
                ),
                Builtin::LaunchDevice(codes) => u64::from(in_codes(
                    self.launch_device(
                        read_le(arg_bytes(frame, b, l, 0)),
                        read_le(arg_bytes(frame, b, l, 1)),
                    ),
                    codes,
                )),
                // The last error is a `cudaError_t` in either ABI (`libcudadevrt` stores
                // translated codes with `cnpSetLastError`).
                Builtin::GetLastError => u64::from(self.ctx.launches.map_or(0, |d| d.take_error())),
                Builtin::PeekAtLastError => {
                    u64::from(self.ctx.launches.map_or(0, |d| d.last_error()))
                }
                // `libcudadevrt` returns what this returns as its call's result: the error.
                Builtin::SetLastError => {
                    let e = read_le(arg_bytes(frame, b, l, 0)) as u32;
                    if let Some(d) = self.ctx.launches {
                        d.set_error(e);
                    }
                    u64::from(e)
                }
                Builtin::DeviceObjectCreate => {
                    let out = read_le(arg_bytes(frame, b, l, 0));
                    let handle = crate::devlaunch::new_handle();
                    let w = warp_ref(&warp.tid, warp.idx, warp.valid);
                    u64::from(self.store_result(w, l as u32, out, 8, Some(handle)))
                }
                Builtin::DeviceObjectNop => u64::from(cnp::SUCCESS),
                kind if kind.is_query() => {
                    let out = read_le(arg_bytes(frame, b, l, 0));
                    let arg = |i| read_le(arg_bytes(frame, b, l, i));
                    let (value, size) = self.query(b.kind, &arg);
                    let w = warp_ref(&warp.tid, warp.idx, warp.valid);
                    u64::from(self.store_result(w, l as u32, out, size, value))
                }
                _ => 0,
            };
        }
        super::calls::write_rets(warp, b, m, &rets);
    }

    /// The linear index of the block running now.
    fn linear_block(&self) -> u64 {
        let [gx, gy, _] = self.ctx.grid.map(u64::from);
        let [x, y, z] = self.block_idx.map(u64::from);
        x + gx * (y + gy * z)
    }

    /// Device-side `cudaDeviceSynchronize` (CUDA 11) for the lanes in `m`: the grids this
    /// block launched so far run, each with its descendants, while the block waits (its warps
    /// are this worker's, so none runs meanwhile, as a GPU swaps a waiting block out; the call
    /// is no barrier). `cudaErrorSyncDepthExceeded` at or past the sync depth limit. A fault
    /// of a grid it ran is the launch's. The watchdog, cancellation and sibling faults are
    /// checked first: grids too small to reach a check of their own may wait in a loop.
    pub(super) fn device_synchronize(
        &mut self,
        warp: &mut Warp,
        b: &BuiltinCall,
        m: u32,
        line: u32,
    ) -> Result<(), Fault> {
        self.check_control(warp_ref(&warp.tid, warp.idx, warp.valid), line)?;
        let code = match self.ctx.launches {
            None => 0,
            Some(d) if !d.may_synchronize(self.ctx.depth) => {
                d.set_error(crate::devlaunch::CUDA_ERROR_SYNC_DEPTH_EXCEEDED);
                crate::devlaunch::CUDA_ERROR_SYNC_DEPTH_EXCEEDED
            }
            Some(_) => {
                let origin = (self.ctx.grid_id, self.linear_block());
                let stats = crate::run_launched_by_block(self.ctx, origin)?;
                self.insts += stats.thread_instructions;
                0
            }
        };
        super::calls::write_rets(warp, b, m, &[u64::from(code); 32]);
        Ok(())
    }

    /// A device runtime query's answer and its size in bytes (`None`: `cudaErrorInvalidValue`);
    /// `arg(i)` is the call's argument `i` (0 is where the answer goes).
    fn query(&self, kind: Builtin, arg: &dyn Fn(usize) -> u64) -> (Option<u64>, usize) {
        let int = |v: Option<i32>| (v.map(|v| u64::from(v as u32)), 4);
        let kernel_attributes = |f: u64| {
            self.kernel_at(f)
                .and_then(|k| self.ctx.function_attributes?.get(k))
        };
        match kind {
            Builtin::GetDevice => int(Some(0)),
            Builtin::GetDeviceCount => int(Some(1)),
            Builtin::DeviceGetAttribute => {
                let (attr, device) = (arg(1) as u32 as usize, arg(2) as u32);
                int(self
                    .ctx
                    .attributes
                    .filter(|_| device == 0)
                    .and_then(|a| a.get(attr).copied()))
            }
            // `size_t`.
            Builtin::GetLimit => (
                self.ctx
                    .limits
                    .and_then(|l| l.get(arg(1) as u32 as usize).copied()),
                8,
            ),
            // cudaFuncCachePreferNone.
            Builtin::GetCacheConfig => int(Some(0)),
            // cudaSharedMemBankSizeFourByte.
            Builtin::GetSharedMemConfig => int(Some(1)),
            Builtin::FuncGetAttribute => {
                let attr = arg(1) as u32 as usize;
                int(kernel_attributes(arg(2)).and_then(|a| a.get(attr).copied()))
            }
            Builtin::MaxActiveBlocks => {
                let (Some(func), Some(dev)) = (kernel_attributes(arg(1)), self.ctx.attributes)
                else {
                    return int(None);
                };
                let get = |t: &[i32], i: usize| i64::from(t.get(i).copied().unwrap_or(0));
                let n = vgpu_proto::cuda::blocks_per_multiprocessor(
                    &|i| get(dev, i),
                    &|i| get(func, i),
                    i64::from(arg(2) as u32 as i32),
                    i64::try_from(arg(3)).unwrap_or(i64::MAX),
                );
                int(Some(i32::try_from(n).unwrap_or(i32::MAX)))
            }
            _ => int(None),
        }
    }

    /// Writes a device runtime call's result, `size` bytes of `value`, where lane `lane`'s
    /// pointer `out` points: the call's code (`INVALID_VALUE` for no value or a bad pointer).
    fn store_result(
        &mut self,
        w: WarpRef<'_>,
        lane: u32,
        out: u64,
        size: usize,
        value: Option<u64>,
    ) -> u32 {
        match value {
            Some(v)
                if self
                    .store_any(w, lane, Space::Generic, out, size, v, Ordering::Relaxed)
                    .is_ok() =>
            {
                cnp::SUCCESS
            }
            _ => cnp::INVALID_VALUE,
        }
    }

    /// The index of the kernel whose address `f` is.
    fn kernel_at(&self, f: u64) -> Option<usize> {
        let id = usize::try_from(f.checked_sub(crate::FUNCTION_WINDOW)?).ok()?;
        let k = *self.ctx.prog.kernel_of_func.get(id)?;
        (k != u32::MAX).then_some(k as usize)
    }

    /// `cnpGetParameterBufferV2`: a buffer from the heap for the parameters of a launch of the
    /// kernel at `f`; 0 (the launch then does not happen) when `f` is no kernel (or one taking
    /// more than 4 KiB of parameters), the launch would pass the pending or depth limits, or
    /// the heap has no room.
    fn parameter_buffer(&mut self, f: u64, grid: [u32; 3], block: [u32; 3], shared: u32) -> u64 {
        let (Some(d), Some(heap)) = (self.ctx.launches, self.ctx.heap) else {
            return 0;
        };
        let Some(kernel) = self
            .kernel_at(f)
            .filter(|&k| self.ctx.prog.kernels[k].param_bytes <= crate::devlaunch::MAX_PARAM_BYTES)
        else {
            d.set_error(cnp::to_cuda(cnp::INVALID_VALUE));
            return 0;
        };
        if let Err(e) = d.admit(self.ctx.depth) {
            d.set_error(cnp::to_cuda(e));
            return 0;
        }
        let bytes = (self.ctx.prog.kernels[kernel].param_bytes as u64).max(1);
        let addr = heap.malloc(bytes, PARAM_BUFFER_ALIGN);
        if addr == 0 {
            d.set_error(cnp::to_cuda(cnp::PENDING_COUNT_EXCEEDED));
            return 0;
        }
        d.hand_out(addr, kernel, grid, block, shared, self.ctx.depth + 1);
        addr
    }

    /// `cnpLaunchDeviceV2`: queues the grid the buffer at `addr` was made for, with a copy of
    /// the parameters written there, and gives the buffer back to the heap; `stream` says
    /// whether it is a tail launch. A failure is also the device runtime's last error
    /// (`cudaGetLastError` after a `<<<>>>` launch).
    fn launch_device(&mut self, addr: u64, stream: u64) -> u32 {
        let e = self.queue_launch(addr, stream == crate::devlaunch::STREAM_TAIL_LAUNCH);
        if e != cnp::SUCCESS
            && let Some(d) = self.ctx.launches
        {
            d.set_error(cnp::to_cuda(e));
        }
        e
    }

    fn queue_launch(&mut self, addr: u64, tail: bool) -> u32 {
        let Some(d) = self.ctx.launches else {
            return cnp::INVALID_VALUE;
        };
        let Some(crate::devlaunch::Pending {
            kernel,
            grid,
            block,
            shared,
            depth,
        }) = d.take_buffer(addr)
        else {
            return cnp::INVALID_VALUE;
        };
        let info = &self.ctx.prog.kernels[kernel];
        let mut params = vec![0u8; info.param_bytes];
        let read = self
            .ctx
            .memory
            .lookup(addr)
            .is_some_and(|(base, buf)| buf.read((addr - base) as usize, &mut params).is_ok());
        if let Some(heap) = self.ctx.heap {
            heap.free(addr);
        }
        if !read {
            return cnp::INVALID_VALUE;
        }
        let threads = block.iter().map(|&x| u64::from(x)).product::<u64>();
        let fits = (0..3).all(|i| {
            (1..=crate::MAX_GRID_DIM[i]).contains(&grid[i])
                && (1..=crate::MAX_BLOCK_DIM[i]).contains(&block[i])
        }) && threads <= u64::from(info.max_threads_per_block)
            && shared as usize <= crate::MAX_SHARED_BYTES_PER_BLOCK;
        if !fits {
            return cnp::INVALID_CONFIGURATION;
        }
        match d.queue(ChildGrid {
            id: crate::next_grid_id(),
            origin: (self.ctx.grid_id, self.linear_block()),
            tail,
            kernel,
            grid,
            block,
            shared,
            depth,
            params,
            next_block: 0,
        }) {
            Ok(()) => cnp::SUCCESS,
            Err(e) => e,
        }
    }
}
