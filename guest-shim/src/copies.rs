//! Pitched copies and memsets (`cuMemcpy2D`, `cuMemcpy3D`, `cuMemsetD2D*`,
//! their asynchronous forms) and copies between contexts (`cuMemcpyPeer`).
//!
//! A pitched copy moves `Height` × `Depth` rows of `WidthInBytes` bytes. When
//! both sides are contiguous it is one copy; otherwise rows to the device go
//! as one asynchronous copy each (the last one waits for a synchronous
//! call), and rows from the device are read as the one range that covers
//! them when that range is at most [`MAX_COVER_RATIO`] times the data (else
//! row by row) and scattered in the guest. A CUDA array is device memory with its own pitch
//! ([`crate::arrays`]): its side of a copy is a pitched device side, checked against the
//! array's extent.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use vgpu_proto::cuda;

use crate::driver::{self as drv, Space};
use crate::exports::{CUdeviceptr, CUhandle, h};
use crate::ffi::{CUresult, ffi};

/// `CU_MEMORYTYPE_*`.
mod memtype {
    pub const HOST: u32 = 1;
    pub const DEVICE: u32 = 2;
    pub const ARRAY: u32 = 3;
    pub const UNIFIED: u32 = 4;
}

/// A read from the device covers the rows' whole span when it is at most
/// this many times the bytes copied.
pub const MAX_COVER_RATIO: u64 = 4;

/// `CUDA_MEMCPY2D`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Memcpy2D {
    src_x_in_bytes: usize,
    src_y: usize,
    src_memory_type: u32,
    src_host: *const c_void,
    src_device: CUdeviceptr,
    src_array: *mut c_void,
    src_pitch: usize,
    dst_x_in_bytes: usize,
    dst_y: usize,
    dst_memory_type: u32,
    dst_host: *mut c_void,
    dst_device: CUdeviceptr,
    dst_array: *mut c_void,
    dst_pitch: usize,
    width_in_bytes: usize,
    height: usize,
}

/// `CUDA_MEMCPY3D`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Memcpy3D {
    src_x_in_bytes: usize,
    src_y: usize,
    src_z: usize,
    src_lod: usize,
    src_memory_type: u32,
    src_host: *const c_void,
    src_device: CUdeviceptr,
    src_array: *mut c_void,
    reserved0: *mut c_void,
    src_pitch: usize,
    src_height: usize,
    dst_x_in_bytes: usize,
    dst_y: usize,
    dst_z: usize,
    dst_lod: usize,
    dst_memory_type: u32,
    dst_host: *mut c_void,
    dst_device: CUdeviceptr,
    dst_array: *mut c_void,
    reserved1: *mut c_void,
    dst_pitch: usize,
    dst_height: usize,
    width_in_bytes: usize,
    height: usize,
    depth: usize,
}

impl Memcpy3D {
    /// A one-dimensional copy of `len` bytes from `src` to `dst`, each (device?, address): what
    /// `cuGraphMemcpyNodeGetParams` reports for a captured plain copy.
    pub fn linear(src: (bool, u64), dst: (bool, u64), len: usize) -> Self {
        let kind = |device: bool| {
            if device {
                memtype::DEVICE
            } else {
                memtype::HOST
            }
        };
        let null = std::ptr::null_mut();
        Self {
            src_x_in_bytes: 0,
            src_y: 0,
            src_z: 0,
            src_lod: 0,
            src_memory_type: kind(src.0),
            src_host: if src.0 { null } else { src.1 as *const c_void },
            src_device: if src.0 { src.1 } else { 0 },
            src_array: null,
            reserved0: null,
            src_pitch: 0,
            src_height: 0,
            dst_x_in_bytes: 0,
            dst_y: 0,
            dst_z: 0,
            dst_lod: 0,
            dst_memory_type: kind(dst.0),
            dst_host: if dst.0 { null } else { dst.1 as *mut c_void },
            dst_device: if dst.0 { dst.1 } else { 0 },
            dst_array: null,
            reserved1: null,
            dst_pitch: 0,
            dst_height: 0,
            width_in_bytes: len,
            height: 1,
            depth: 1,
        }
    }
}

/// One side of a pitched copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Side {
    /// Host or device, and the base address.
    device: bool,
    base: u64,
    x: u64,
    y: u64,
    z: u64,
    pitch: u64,
    /// Rows per slice (3-D).
    height: u64,
    /// The array, when the side is one (its pitch and rows are the array's).
    array: Option<crate::arrays::Array>,
}

impl Side {
    fn new(memory_type: u32, host: u64, device: u64, array: *mut c_void) -> drv::CuRes<Self> {
        let (is_device, base) = match memory_type {
            memtype::HOST => (false, host),
            memtype::DEVICE => (true, device),
            memtype::UNIFIED => (matches!(drv::space_of(device)?, Space::Device), device),
            memtype::ARRAY => {
                let a = crate::arrays::get(array as u64)?;
                return Ok(Side {
                    device: true,
                    base: a.ptr,
                    x: 0,
                    y: 0,
                    z: 0,
                    pitch: a.pitch,
                    height: a.rows(),
                    array: Some(a),
                });
            }
            _ => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
        };
        if base == 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(Side {
            device: is_device,
            base,
            x: 0,
            y: 0,
            z: 0,
            pitch: 0,
            height: 0,
            array: None,
        })
    }

    /// Sets the caller's pitch and rows per slice, which an array side ignores (CUDA does).
    fn set_pitch(&mut self, pitch: u64, height: u64) {
        if self.array.is_none() {
            (self.pitch, self.height) = (pitch, height);
        }
    }

    /// Whether a copy of `s` from this side's offsets stays inside its array (always true for
    /// memory that is not an array).
    fn fits(&self, s: &Shape) -> bool {
        let Some(a) = &self.array else {
            return true;
        };
        let within = |at: u64, n: u64, limit: u64| at.checked_add(n).is_some_and(|e| e <= limit);
        within(self.x, s.width, a.row_bytes())
            && within(self.y, s.height, a.rows())
            && within(self.z, s.depth, a.slices())
    }

    /// Address of row `row` of slice `slice`.
    fn row(&self, row: u64, slice: u64) -> drv::CuRes<u64> {
        let rows = self
            .z
            .checked_add(slice)
            .and_then(|z| z.checked_mul(self.height))
            .and_then(|r| r.checked_add(self.y))
            .and_then(|r| r.checked_add(row))
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        rows.checked_mul(self.pitch)
            .and_then(|o| o.checked_add(self.x))
            .and_then(|o| o.checked_add(self.base))
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)
    }
}

/// The shape of a pitched copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    width: u64,
    height: u64,
    depth: u64,
}

/// Runs a pitched copy.
fn copy(src: Side, dst: Side, s: Shape, stream: u64, sync: bool) -> drv::CuRes<()> {
    if s.width == 0 || s.height == 0 || s.depth == 0 {
        return Ok(());
    }
    if !src.fits(&s) || !dst.fits(&s) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    // Rows must fit in their pitch (a single row needs no pitch).
    for side in [&src, &dst] {
        let multi_row = s.height > 1 || s.depth > 1;
        if multi_row && side.pitch < side.x.saturating_add(s.width) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        if s.depth > 1 && side.height < side.y.saturating_add(s.height) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
    }
    let total = s
        .width
        .checked_mul(s.height)
        .and_then(|b| b.checked_mul(s.depth))
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    // One run of bytes on a side when its rows follow each other (a single row needs no pitch)
    // and so do its slices: with more than one slice, even rows of one row are a pitch apart.
    let one_row = s.height == 1 && s.depth == 1;
    let contiguous = |side: &Side| {
        (one_row || side.pitch == s.width) && (s.depth == 1 || side.height == s.height)
    };
    let rows: Vec<(u64, u64)> = if contiguous(&src) && contiguous(&dst) {
        vec![(0, 0)]
    } else {
        (0..s.depth)
            .flat_map(|z| (0..s.height).map(move |y| (y, z)))
            .collect()
    };
    let len = if rows.len() == 1 { total } else { s.width };
    let len_usize = usize::try_from(len).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
    let n = rows.len();
    match (src.device, dst.device) {
        (false, true) => {
            for (i, &(y, z)) in rows.iter().enumerate() {
                let from = src.row(y, z)? as *const u8;
                // SAFETY: the caller's host rows are readable for the copy's width (CUDA
                // contract for the source of a pitched copy).
                let bytes = unsafe { std::slice::from_raw_parts(from, len_usize) };
                drv::memcpy_htod(dst.row(y, z)?, bytes, stream, sync && i + 1 == n)?;
            }
            Ok(())
        }
        (true, true) => {
            for (i, &(y, z)) in rows.iter().enumerate() {
                drv::memcpy_dtod(
                    dst.row(y, z)?,
                    src.row(y, z)?,
                    len,
                    stream,
                    sync && i + 1 == n,
                )?;
            }
            Ok(())
        }
        (true, false) => {
            let first = src.row(0, 0)?;
            let end = src
                .row(s.height - 1, s.depth - 1)?
                .checked_add(s.width)
                .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
            let span = end - first;
            // Recording a graph node keeps one transfer per row: a cover buffer would not
            // outlive the call.
            if rows.len() > 1
                && span <= total.saturating_mul(MAX_COVER_RATIO)
                && !crate::stream_capture::recording()
            {
                let mut cover =
                    vec![0u8; usize::try_from(span).map_err(|_| cuda::CUDA_ERROR_OUT_OF_MEMORY)?];
                drv::memcpy_dtoh(&mut cover, first, stream)?;
                for &(y, z) in &rows {
                    let at = (src.row(y, z)? - first) as usize;
                    // SAFETY: the caller's host rows are writable for the copy's width (CUDA
                    // contract for the destination of a pitched copy).
                    let to = unsafe {
                        std::slice::from_raw_parts_mut(dst.row(y, z)? as *mut u8, len_usize)
                    };
                    to.copy_from_slice(&cover[at..at + len_usize]);
                }
                return Ok(());
            }
            for &(y, z) in &rows {
                // SAFETY: as above.
                let to =
                    unsafe { std::slice::from_raw_parts_mut(dst.row(y, z)? as *mut u8, len_usize) };
                drv::memcpy_dtoh(to, src.row(y, z)?, stream)?;
            }
            Ok(())
        }
        (false, false) => {
            if crate::stream_capture::recording() {
                // A graph node copying host to host would have to run in the shim; not provided.
                return Err(drv::unsupported(
                    "graph memcpy nodes between two host buffers",
                ));
            }
            for &(y, z) in &rows {
                // SAFETY: both host rows are valid for the copy's width (CUDA contract); copy
                // handles overlap.
                unsafe {
                    std::ptr::copy(
                        src.row(y, z)? as *const u8,
                        dst.row(y, z)? as *mut u8,
                        len_usize,
                    )
                };
            }
            Ok(())
        }
    }
}

fn copy_2d(p: *const Memcpy2D, stream: u64, sync: bool) -> drv::CuRes<()> {
    // SAFETY: NULL or the caller's CUDA_MEMCPY2D (CUDA contract).
    let p = unsafe { p.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    let mut src = Side::new(
        p.src_memory_type,
        p.src_host as u64,
        p.src_device,
        p.src_array,
    )?;
    let mut dst = Side::new(
        p.dst_memory_type,
        p.dst_host as u64,
        p.dst_device,
        p.dst_array,
    )?;
    (src.x, src.y) = (p.src_x_in_bytes as u64, p.src_y as u64);
    (dst.x, dst.y) = (p.dst_x_in_bytes as u64, p.dst_y as u64);
    src.set_pitch(p.src_pitch as u64, src.height);
    dst.set_pitch(p.dst_pitch as u64, dst.height);
    let shape = Shape {
        width: p.width_in_bytes as u64,
        height: p.height as u64,
        depth: 1,
    };
    copy(src, dst, shape, stream, sync)
}

pub(crate) fn copy_3d(p: *const Memcpy3D, stream: u64, sync: bool) -> drv::CuRes<()> {
    // SAFETY: NULL or the caller's CUDA_MEMCPY3D (CUDA contract).
    let p = unsafe { p.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    if p.src_lod != 0 || p.dst_lod != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let mut src = Side::new(
        p.src_memory_type,
        p.src_host as u64,
        p.src_device,
        p.src_array,
    )?;
    let mut dst = Side::new(
        p.dst_memory_type,
        p.dst_host as u64,
        p.dst_device,
        p.dst_array,
    )?;
    (src.x, src.y, src.z) = (p.src_x_in_bytes as u64, p.src_y as u64, p.src_z as u64);
    src.set_pitch(p.src_pitch as u64, p.src_height as u64);
    (dst.x, dst.y, dst.z) = (p.dst_x_in_bytes as u64, p.dst_y as u64, p.dst_z as u64);
    dst.set_pitch(p.dst_pitch as u64, p.dst_height as u64);
    let shape = Shape {
        width: p.width_in_bytes as u64,
        height: p.height as u64,
        depth: p.depth as u64,
    };
    copy(src, dst, shape, stream, sync)
}

/// A 2-D memset: `height` rows of `width` elements (`value` of `elem` bytes),
/// `pitch` bytes apart.
pub(crate) fn memset_2d(
    dst: u64,
    pitch: usize,
    (value, elem): (u32, u32),
    width: usize,
    height: usize,
    stream: u64,
    sync: bool,
) -> drv::CuRes<()> {
    if width == 0 || height == 0 {
        return Ok(());
    }
    let row_bytes = (width as u64)
        .checked_mul(u64::from(elem))
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    if height > 1 && (pitch as u64) < row_bytes {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if height == 1 || pitch as u64 == row_bytes {
        let count = (width as u64)
            .checked_mul(height as u64)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        return drv::memset(dst, value, elem, count, stream, sync);
    }
    for y in 0..height {
        let at = (y as u64)
            .checked_mul(pitch as u64)
            .and_then(|o| o.checked_add(dst))
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        drv::memset(
            at,
            value,
            elem,
            width as u64,
            stream,
            sync && y + 1 == height,
        )?;
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2D_v2(p: *const Memcpy2D) -> CUresult {
    ffi("cuMemcpy2D_v2", || copy_2d(p, 0, true))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(p: *const Memcpy2D) -> CUresult {
    ffi("cuMemcpy2DUnaligned_v2", || copy_2d(p, 0, true))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(p: *const Memcpy2D, stream: CUhandle) -> CUresult {
    ffi("cuMemcpy2DAsync_v2", || copy_2d(p, h(stream), false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy3D_v2(p: *const Memcpy3D) -> CUresult {
    ffi("cuMemcpy3D_v2", || copy_3d(p, 0, true))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy3DAsync_v2(p: *const Memcpy3D, stream: CUhandle) -> CUresult {
    ffi("cuMemcpy3DAsync_v2", || copy_3d(p, h(stream), false))
}

macro_rules! memset_2d_exports {
    ($($sync:ident, $async_:ident, $t:ty, $elem:expr;)*) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $sync(dst: CUdeviceptr, pitch: usize, v: $t, w: usize, ht: usize) -> CUresult {
            ffi(stringify!($sync), || memset_2d(dst, pitch, (u32::from(v), $elem), w, ht, 0, true))
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn $async_(
            dst: CUdeviceptr,
            pitch: usize,
            v: $t,
            w: usize,
            ht: usize,
            stream: CUhandle,
        ) -> CUresult {
            ffi(stringify!($async_), || {
                memset_2d(dst, pitch, (u32::from(v), $elem), w, ht, h(stream), false)
            })
        }
    )*};
}

memset_2d_exports! {
    cuMemsetD2D8_v2, cuMemsetD2D8Async, u8, 1;
    cuMemsetD2D16_v2, cuMemsetD2D16Async, u16, 2;
    cuMemsetD2D32_v2, cuMemsetD2D32Async, u32, 4;
}

/// `cuMemcpyPeer`: the VM's contexts share its one device, so a copy between
/// them is a device-to-device copy.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyPeer(
    dst: CUdeviceptr,
    _dst_ctx: CUhandle,
    src: CUdeviceptr,
    _src_ctx: CUhandle,
    n: usize,
) -> CUresult {
    ffi("cuMemcpyPeer", || {
        drv::memcpy_dtod(dst, src, n as u64, 0, true)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    _dst_ctx: CUhandle,
    src: CUdeviceptr,
    _src_ctx: CUhandle,
    n: usize,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemcpyPeerAsync", || {
        drv::memcpy_dtod(dst, src, n as u64, h(stream), false)
    })
}

/// A `CUDA_MEMCPY3D_PEER` as the `CUDA_MEMCPY3D` it equals on one device: the two structures
/// have the same layout, the peer form's source and destination contexts where the plain form
/// has its two reserved (NULL) pointers, and the VM's contexts share its one device (as in
/// [`cuMemcpyPeer`]).
fn peer_as_3d(p: *const Memcpy3D) -> drv::CuRes<Memcpy3D> {
    // SAFETY: NULL or the caller's CUDA_MEMCPY3D_PEER (CUDA contract), laid out as Memcpy3D.
    let mut plain = *unsafe { p.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    plain.reserved0 = std::ptr::null_mut();
    plain.reserved1 = std::ptr::null_mut();
    Ok(plain)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy3DPeer(p: *const Memcpy3D) -> CUresult {
    ffi("cuMemcpy3DPeer", || copy_3d(&peer_as_3d(p)?, 0, true))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy3DPeerAsync(p: *const Memcpy3D, stream: CUhandle) -> CUresult {
    ffi("cuMemcpy3DPeerAsync", || {
        copy_3d(&peer_as_3d(p)?, h(stream), false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(base: u64, pitch: u64) -> Side {
        Side {
            device: false,
            base,
            x: 0,
            y: 0,
            z: 0,
            pitch,
            height: 0,
            array: None,
        }
    }

    #[test]
    fn host_to_host_rows_respect_both_pitches() {
        let src: Vec<u8> = (0..40).collect();
        let mut dst = vec![0u8; 60];
        let mut s = side(src.as_ptr() as u64, 10);
        s.x = 2;
        s.y = 1;
        let d = side(dst.as_mut_ptr() as u64, 20);
        let shape = Shape {
            width: 3,
            height: 2,
            depth: 1,
        };
        copy(s, d, shape, 0, true).unwrap();
        assert_eq!(&dst[0..3], &[12, 13, 14]);
        assert_eq!(&dst[20..23], &[22, 23, 24]);
        assert!(dst[3..20].iter().all(|&b| b == 0));
    }

    #[test]
    fn slices_of_one_row_are_a_pitch_apart() {
        // Three slices of one 4-byte row: packed on the host, 16 bytes apart on the other
        // side (a layered array whose rows are padded).
        let src: Vec<u8> = (1..=12).collect();
        let mut dst = vec![0u8; 48];
        let mut s = side(src.as_ptr() as u64, 4);
        s.height = 1;
        let mut d = side(dst.as_mut_ptr() as u64, 16);
        d.height = 1;
        let shape = Shape {
            width: 4,
            height: 1,
            depth: 3,
        };
        copy(s, d, shape, 0, true).unwrap();
        assert_eq!(&dst[0..4], &[1, 2, 3, 4]);
        assert_eq!(&dst[16..20], &[5, 6, 7, 8]);
        assert_eq!(&dst[32..36], &[9, 10, 11, 12]);
        assert!(dst[4..16].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_pitch_narrower_than_a_row_is_refused() {
        let src = [0u8; 16];
        let mut dst = [0u8; 16];
        let shape = Shape {
            width: 8,
            height: 2,
            depth: 1,
        };
        let r = copy(
            side(src.as_ptr() as u64, 4),
            side(dst.as_mut_ptr() as u64, 8),
            shape,
            0,
            true,
        );
        assert_eq!(r, Err(cuda::CUDA_ERROR_INVALID_VALUE));
        // Zero-sized copies do nothing and succeed.
        let empty = Shape {
            width: 0,
            height: 2,
            depth: 1,
        };
        assert_eq!(copy(side(1, 0), side(2, 0), empty, 0, true), Ok(()));
    }

    #[test]
    fn row_addresses_do_not_overflow() {
        let mut s = side(u64::MAX - 8, 16);
        s.height = 4;
        assert_eq!(s.row(0, 0), Ok(u64::MAX - 8));
        assert_eq!(s.row(1, 0), Err(cuda::CUDA_ERROR_INVALID_VALUE));
    }
}

// ---- cuMemcpy3DBatchAsync (CUDA 12.8) ------------------------------------------------

/// `CU_MEMCPY_OPERAND_TYPE_POINTER` and `CU_MEMCPY_OPERAND_TYPE_ARRAY`.
const OPERAND_POINTER: u32 = 1;
const OPERAND_ARRAY: u32 = 2;

/// `CUmemcpy3DOperand`: its type, then the union as four words: a pointer operand's `ptr`,
/// `rowLength`, `layerHeight` and location hint (two ints), or an array operand's array and
/// element offset (`x`, `y`, `z`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Memcpy3DOperand {
    kind: u32,
    op: [u64; 4],
}

/// `CUDA_MEMCPY3D_BATCH_OP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Memcpy3DBatchOp {
    src: Memcpy3DOperand,
    dst: Memcpy3DOperand,
    /// Width, height and depth, in elements.
    extent: [usize; 3],
    src_access_order: u32,
    flags: u32,
}

const _: () = assert!(std::mem::size_of::<Memcpy3DOperand>() == 40);
const _: () = assert!(std::mem::size_of::<Memcpy3DBatchOp>() == 112);

/// One side of a batch copy, in the terms of `CUDA_MEMCPY3D`.
struct BatchSide {
    memory_type: u32,
    device: u64,
    array: *mut c_void,
    x_bytes: usize,
    y: usize,
    z: usize,
    pitch: usize,
    height: usize,
}

impl Memcpy3DOperand {
    /// The operand's array, if it is one (its element size).
    fn array_texel(&self) -> drv::CuRes<Option<usize>> {
        match self.kind {
            OPERAND_POINTER => Ok(None),
            OPERAND_ARRAY => {
                let a = crate::arrays::get(self.op[0])?;
                Ok(Some(a.texel_bytes() as usize))
            }
            _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// This operand as a side of a copy of `extent` elements of `elem` bytes: a pointer's rows
    /// and layers are its own lengths, or packed when 0 (no shorter than the copy's).
    fn side(&self, extent: [usize; 3], elem: usize) -> drv::CuRes<BatchSide> {
        let bytes = |n: u64| {
            usize::try_from(n)
                .ok()
                .and_then(|n| n.checked_mul(elem))
                .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)
        };
        if self.kind == OPERAND_ARRAY {
            return Ok(BatchSide {
                memory_type: memtype::ARRAY,
                device: 0,
                array: self.op[0] as *mut c_void,
                x_bytes: bytes(self.op[1])?,
                y: usize::try_from(self.op[2]).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?,
                z: usize::try_from(self.op[3]).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?,
                pitch: 0,
                height: 0,
            });
        }
        let [width, height, _] = extent;
        let (row, layer) = (self.op[1] as usize, self.op[2] as usize);
        if (row != 0 && row < width) || (layer != 0 && layer < height) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(BatchSide {
            memory_type: memtype::UNIFIED,
            device: self.op[0],
            array: std::ptr::null_mut(),
            x_bytes: 0,
            y: 0,
            z: 0,
            pitch: bytes(if row == 0 { width } else { row } as u64)?,
            height: if layer == 0 { height } else { layer },
        })
    }
}

impl Memcpy3DBatchOp {
    /// The copy as a `CUDA_MEMCPY3D`, checked as CUDA checks a batch's operation: a non-zero
    /// extent, a source access order CUDA defines, known flags and operand types, arrays of one
    /// element size.
    fn as_memcpy_3d(&self) -> drv::CuRes<Memcpy3D> {
        let inval = cuda::CUDA_ERROR_INVALID_VALUE;
        if self.extent.contains(&0)
            || !(1..=3).contains(&self.src_access_order)
            || self.flags & !0x1 != 0
        {
            return Err(inval);
        }
        let elem = match (self.src.array_texel()?, self.dst.array_texel()?) {
            (Some(a), Some(b)) if a != b => return Err(inval),
            (Some(a), _) | (None, Some(a)) => a,
            (None, None) => 1,
        };
        let (s, d) = (
            self.src.side(self.extent, elem)?,
            self.dst.side(self.extent, elem)?,
        );
        let null = std::ptr::null_mut();
        Ok(Memcpy3D {
            src_x_in_bytes: s.x_bytes,
            src_y: s.y,
            src_z: s.z,
            src_lod: 0,
            src_memory_type: s.memory_type,
            src_host: std::ptr::null(),
            src_device: s.device,
            src_array: s.array,
            reserved0: null,
            src_pitch: s.pitch,
            src_height: s.height,
            dst_x_in_bytes: d.x_bytes,
            dst_y: d.y,
            dst_z: d.z,
            dst_lod: 0,
            dst_memory_type: d.memory_type,
            dst_host: null,
            dst_device: d.device,
            dst_array: d.array,
            reserved1: null,
            dst_pitch: d.pitch,
            dst_height: d.height,
            width_in_bytes: self.extent[0].checked_mul(elem).ok_or(inval)?,
            height: self.extent[1],
            depth: self.extent[2],
        })
    }
}

/// `cuMemcpy3DBatchAsync`: each operation a `cuMemcpy3DAsync` on `stream`, in order (CUDA lets
/// them run in any order). Every operation is checked before any runs; returns the index of the
/// operation an error is about (`usize::MAX` when none).
///
/// # Safety
/// `ops` is NULL or holds `n` operations (CUDA contract).
unsafe fn memcpy_3d_batch(
    n: usize,
    ops: *const Memcpy3DBatchOp,
    flags: u64,
    stream: u64,
) -> (drv::CuRes<()>, usize) {
    let inval = (Err(cuda::CUDA_ERROR_INVALID_VALUE), usize::MAX);
    if n == 0 || ops.is_null() || flags != 0 || drv::is_legacy_stream(stream) {
        return inval;
    }
    // SAFETY: non-NULL and holding `n` operations (this function's contract).
    let ops = unsafe { std::slice::from_raw_parts(ops, n) };
    let mut copies = Vec::with_capacity(n);
    for (i, op) in ops.iter().enumerate() {
        match op.as_memcpy_3d() {
            Ok(c) => copies.push(c),
            Err(e) => return (Err(e), i),
        }
    }
    for (i, c) in copies.iter().enumerate() {
        if let Err(e) = copy_3d(c, stream, false) {
            return (Err(e), i);
        }
    }
    (Ok(()), usize::MAX)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy3DBatchAsync(
    n: usize,
    ops: *const Memcpy3DBatchOp,
    fail_idx: *mut usize,
    flags: u64,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemcpy3DBatchAsync", || {
        // SAFETY: the caller's operations (CUDA contract, memcpy_3d_batch's).
        let (r, at) = unsafe { memcpy_3d_batch(n, ops, flags, h(stream)) };
        if r.is_err() && !fail_idx.is_null() {
            // SAFETY: a non-NULL out-pointer of the caller (CUDA contract).
            unsafe { crate::ffi::write_out(fail_idx, at) }?;
        }
        r
    })
}

/// CUDA 13.2's `cuMemcpy3DWithAttributesAsync`: one 3-D copy, as a batch of one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy3DWithAttributesAsync(
    op: *const Memcpy3DBatchOp,
    flags: u64,
    stream: CUhandle,
) -> CUresult {
    // SAFETY: the caller's operation (CUDA contract), one element.
    unsafe { cuMemcpy3DBatchAsync(1, op, std::ptr::null_mut(), flags, stream) }
}

/// `cuMemcpy3DBatchAsync_v2` (CUDA 13): the same without the failing operation's index.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy3DBatchAsync_v2(
    n: usize,
    ops: *const Memcpy3DBatchOp,
    flags: u64,
    stream: CUhandle,
) -> CUresult {
    // SAFETY: the same contract as cuMemcpy3DBatchAsync's, with no failing index asked for.
    unsafe { cuMemcpy3DBatchAsync(n, ops, std::ptr::null_mut(), flags, stream) }
}
