//! Green contexts (CUDA 12.4): contexts whose kernels run on a partition of the device's
//! multiprocessors. A program takes the device's SM resource (`cuDeviceGetDevResource`),
//! splits it (`cuDevSmResourceSplitByCount`), makes a descriptor of one or more pieces
//! (`cuDevResourceGenerateDesc`) and creates a green context from it (`cuGreenCtxCreate`), whose
//! `CUcontext` (`cuCtxFromGreenCtx`) and streams (`cuGreenCtxStreamCreate`) it then uses as any
//! other's.
//!
//! The resources and descriptors live in the guest: a resource is CUDA's 144-byte
//! `CUdevResource`, whose internal bytes carry where it came from (so that pieces of different
//! splits are not combined and a split's pieces are not split again, as CUDA refuses), and a
//! descriptor is a handle of this process's. vgpud creates the green context
//! (`GreenCtxCreate`) with its multiprocessor count: a context like any other whose kernels run
//! on at most that many of the device's execution units at a time, and which holds the primary
//! context (whose memory it shares) until it is destroyed.
//!
//! `cuDevSmResourceSplitByCount` follows NVIDIA's documented granularity for the device's
//! compute capability ([`Granularity::of`]; `CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING`
//! lowers it to one SM), and CUDA 13's `cuDevSmResourceSplit` takes explicit group sizes
//! ([`split_structured`]).
#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use vgpu_proto::{cuda, msg};

use crate::driver::{self as drv, CuRes};
use crate::exports::{CUdevice, CUhandle, h, p};
use crate::ffi::{CUresult, ffi};
use crate::{in_bytes, out, out_bytes};

/// `sizeof(CUdevResource)`: 144 bytes in CUDA 12.4 to 13 (the type, 92 internal bytes, and 48
/// bytes of union, which CUDA 13 splits into 40 and a `nextResource` pointer).
pub const RESOURCE_BYTES: usize = 144;
/// `CU_DEV_RESOURCE_TYPE_SM`.
pub const RESOURCE_TYPE_SM: u32 = 1;
/// `CU_GREEN_CTX_DEFAULT_STREAM`: required by `cuGreenCtxCreate`.
pub const GREEN_CTX_DEFAULT_STREAM: c_uint = 0x1;
/// `CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING`.
pub const SPLIT_IGNORE_SM_COSCHEDULING: c_uint = 0x1;
/// `CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE` (compute capability 9.0 and later).
pub const SPLIT_MAX_POTENTIAL_CLUSTER_SIZE: c_uint = 0x2;
/// The compute capability from which SMs form clusters (`SPLIT_MAX_POTENTIAL_CLUSTER_SIZE`).
pub(crate) const CLUSTERS_MAJOR: i32 = 9;
/// `CU_STREAM_NON_BLOCKING`: required by `cuGreenCtxStreamCreate`.
const STREAM_NON_BLOCKING: c_uint = 0x1;

/// Offsets in a `CUdevResource`.
mod at {
    /// `type`.
    pub const TYPE: usize = 0;
    /// vgpu's mark in the internal bytes, so that resources it did not write are refused.
    pub const MAGIC: usize = 4;
    /// Where the resource came from ([`super::Origin`]).
    pub const ORIGIN: usize = 8;
    /// The split that made it (0 for a whole device's or context's resource).
    pub const SPLIT: usize = 12;
    /// `sm.smCount`.
    pub const SM_COUNT: usize = 96;
    /// `sm.minSmPartitionSize` (CUDA 13).
    pub const MIN_PARTITION: usize = 100;
    /// `sm.smCoscheduledAlignment` (CUDA 13).
    pub const ALIGNMENT: usize = 104;
}

/// The mark vgpu writes in a resource's internal bytes ("vgSM").
const MAGIC: u32 = 0x4d53_6776;

/// Where a resource came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Origin {
    /// A device's, a context's or a green context's SMs: may be split.
    Whole = 0,
    /// One group of a split.
    Group = 1,
    /// What a split left over.
    Remainder = 2,
}

/// An SM resource as vgpu reads and writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmResource {
    /// Multiprocessors in it.
    pub sm_count: u32,
    /// Where it came from.
    pub origin: Origin,
    /// The split that made it (0: none).
    pub split: u32,
}

/// How finely a device's SMs split, by compute capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granularity {
    /// The fewest SMs in a group.
    pub min: u32,
    /// Groups are multiples of this many SMs.
    pub align: u32,
}

impl Granularity {
    /// NVIDIA's guideline for the CUDA 13 driver vgpu reports (CUDA 13's `cuda.h`, green
    /// contexts): 7.x and 8.x two SMs, in twos; 9.0 and later eight, in eights; 6.x (before
    /// CUDA 13's oldest) one. Ignoring SM co-scheduling: one SM. (CUDA 12's guideline had four
    /// for 8.x.)
    pub fn of(major: i32, flags: c_uint) -> Self {
        if flags & SPLIT_IGNORE_SM_COSCHEDULING != 0 {
            return Self { min: 1, align: 1 };
        }
        match major {
            ..=6 => Self { min: 1, align: 1 },
            7 | 8 => Self { min: 2, align: 2 },
            _ => Self { min: 8, align: 8 },
        }
    }

    /// The largest `coscheduledSmCount` `cuDevSmResourceSplit` takes: 32 from 9.0 (clusters),
    /// else the alignment.
    fn max_coscheduled(self, major: i32) -> u32 {
        if major >= CLUSTERS_MAJOR {
            MAX_COSCHEDULED_SMS
        } else {
            self.align
        }
    }

    /// The SMs of each group when a program asks for at least `min_count`.
    fn group_size(self, min_count: u32) -> u32 {
        min_count.max(self.min).div_ceil(self.align) * self.align
    }
}

impl SmResource {
    /// Writes it as a `CUdevResource` (every byte: the internal ones and CUDA 13's
    /// `nextResource`, NULL, too), with the partition sizes of `g`.
    pub fn write(self, out: &mut [u8], g: Granularity) {
        out.fill(0);
        let mut put = |at: usize, v: u32| out[at..at + 4].copy_from_slice(&v.to_le_bytes());
        put(at::TYPE, RESOURCE_TYPE_SM);
        put(at::MAGIC, MAGIC);
        put(at::ORIGIN, self.origin as u32);
        put(at::SPLIT, self.split);
        put(at::SM_COUNT, self.sm_count);
        put(at::MIN_PARTITION, g.min);
        put(at::ALIGNMENT, g.align);
    }

    /// Reads a resource a program passes back: `CUDA_ERROR_INVALID_RESOURCE_TYPE` for another
    /// type, `CUDA_ERROR_INVALID_VALUE` for bytes vgpu did not write.
    pub fn read(b: &[u8]) -> CuRes<Self> {
        let get = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        if get(at::TYPE) != RESOURCE_TYPE_SM {
            return Err(cuda::CUDA_ERROR_INVALID_RESOURCE_TYPE);
        }
        let origin = match get(at::ORIGIN) {
            0 => Origin::Whole,
            1 => Origin::Group,
            2 => Origin::Remainder,
            _ => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
        };
        if get(at::MAGIC) != MAGIC {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(Self {
            sm_count: get(at::SM_COUNT),
            origin,
            split: get(at::SPLIT),
        })
    }
}

/// What a split makes: `groups` groups of `size` SMs and a remainder of `remainder`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub groups: u32,
    pub size: u32,
    pub remainder: u32,
}

/// Splits `input` into groups of at least `min_count` SMs (`cuDevSmResourceSplitByCount`), at
/// most `wanted` of them (`None`: as many as fit).
pub fn split(
    input: SmResource,
    min_count: u32,
    g: Granularity,
    wanted: Option<u32>,
) -> CuRes<Split> {
    if input.origin != Origin::Whole {
        // CUDA: a split's pieces are split again only through a green context of their own.
        return Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    }
    if min_count > input.sm_count {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let size = g.group_size(min_count);
    let fit = input.sm_count / size;
    let groups = wanted.map_or(fit, |w| w.min(fit));
    Ok(Split {
        groups,
        size,
        remainder: input.sm_count - groups * size,
    })
}

/// The SMs of a descriptor made of `pieces` (`cuDevResourceGenerateDesc`): pieces of one split,
/// or one whole resource; at least one SM.
pub fn combine(pieces: &[SmResource]) -> CuRes<u32> {
    let first = pieces.first().ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    if pieces.len() > 1 && (first.split == 0 || pieces.iter().any(|r| r.split != first.split)) {
        return Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    }
    let total = pieces
        .iter()
        .try_fold(0u32, |t, r| t.checked_add(r.sm_count))
        .ok_or(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)?;
    if total == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    }
    Ok(total)
}

/// `CU_DEV_SM_RESOURCE_GROUP_BACKFILL`: a group's count need not be a multiple of its
/// co-scheduled count.
pub const GROUP_BACKFILL: u32 = 0x1;
/// `CU_DEV_SM_RESOURCE_GROUP_LOCALITY_DOMAIN_ID`: the group's SMs from one locality domain.
pub const GROUP_LOCALITY_DOMAIN_ID: u32 = 0x2;
/// `CU_DEV_SM_RESOURCE_GROUP_LOCALITY_DOMAIN_SUPPLEMENTAL_SMS`.
pub const GROUP_LOCALITY_SUPPLEMENTAL: u32 = 0x4;
/// `CU_DEV_SM_RESOURCE_GROUP_LOCALITY_DOMAIN_ID_ANY`: any domain (a device without locality
/// domains has only that).
pub const LOCALITY_DOMAIN_ANY: u32 = u32::MAX;
/// `cuDevSmResourceSplit`'s groups are whole multiples of this many SMs (at least one).
const STRUCTURED_STEP: u32 = 2;
/// The largest co-scheduled group from compute capability 9.0.
const MAX_COSCHEDULED_SMS: u32 = 32;
/// `sizeof(CU_DEV_SM_RESOURCE_GROUP_PARAMS)`: five fields and eleven reserved words.
pub const GROUP_PARAMS_BYTES: usize = 64;

/// One `CU_DEV_SM_RESOURCE_GROUP_PARAMS` entry of `cuDevSmResourceSplit` (CUDA 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupParams {
    /// SMs of the group; 0: discover (filled in).
    pub sm_count: u32,
    /// SMs co-scheduled together; 0: the default (the alignment).
    pub coscheduled: u32,
    /// `CU_DEV_SM_RESOURCE_GROUP_*`.
    pub flags: u32,
    /// With `GROUP_LOCALITY_DOMAIN_ID`: the domain.
    pub locality_domain: u32,
}

impl GroupParams {
    /// Reads one entry (`smCount`, `coscheduledSmCount`, `preferredCoscheduledSmCount`,
    /// `flags`, `localityDomainId`).
    pub fn read(b: &[u8]) -> Self {
        let get =
            |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
        Self {
            sm_count: get(0),
            coscheduled: get(1),
            flags: get(3),
            locality_domain: get(4),
        }
    }
}

/// `cuDevSmResourceSplit` (CUDA 13): the SMs of each group, in order (discovered counts filled
/// in), and what is left. `results` says whether the groups are made (a discovered count may
/// be 0 only when they are not).
pub fn split_structured(
    input: SmResource,
    groups: &[GroupParams],
    g: Granularity,
    major: i32,
    results: bool,
) -> CuRes<(Vec<u32>, u32)> {
    if input.origin == Origin::Group {
        // CUDA splits a device's, a context's or a remainder.
        return Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    }
    let known = GROUP_BACKFILL | GROUP_LOCALITY_DOMAIN_ID | GROUP_LOCALITY_SUPPLEMENTAL;
    let mut left = input.sm_count;
    let mut counts = Vec::with_capacity(groups.len());
    for p in groups {
        if p.flags & !known != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        if p.flags & GROUP_LOCALITY_DOMAIN_ID != 0 && p.locality_domain != LOCALITY_DOMAIN_ANY {
            // The device has no locality domains: no SMs are in the one asked for.
            return Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        let cos = if p.coscheduled == 0 {
            g.align
        } else {
            p.coscheduled
        };
        if cos > g.max_coscheduled(major) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let backfill = p.flags & GROUP_BACKFILL != 0;
        let take = if p.sm_count == 0 {
            if backfill { left } else { left / cos * cos }
        } else {
            let n = p.sm_count;
            if n < STRUCTURED_STEP
                || n > input.sm_count
                || n % STRUCTURED_STEP != 0
                || (!backfill && n % cos != 0)
            {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            if n > left {
                return Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
            }
            n
        };
        if results && (take == 0 || take < cos) {
            return Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        left -= take;
        counts.push(take);
    }
    Ok((counts, left))
}

/// Set in a green context's handle: its context's handle with this bit (context handles leave
/// bits 63..47 clear), so that the two are never taken for each other.
const GREEN_BIT: u64 = 1 << 62;
/// Set in descriptor handles, which count up from it.
const DESC_BASE: u64 = 1 << 61;

#[derive(Debug, Default)]
struct State {
    /// Descriptors made so far: handle → SMs. CUDA has no call that frees one.
    descs: HashMap<u64, u32>,
    /// Live green contexts: their context's handle → SMs.
    greens: HashMap<u64, u32>,
}

fn state() -> MutexGuard<'static, State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The next split's number (never 0).
fn next_split() -> u32 {
    static N: AtomicU64 = AtomicU64::new(1);
    (N.fetch_add(1, Ordering::Relaxed) as u32).max(1)
}

/// Whether context `c` is a green context's (`cuCtxDestroy` refuses it).
pub fn is_green(c: u64) -> bool {
    c != 0 && state().greens.contains_key(&c)
}

/// The SMs of context `c` if it is a green context's.
pub fn sms_of(c: u64) -> Option<u32> {
    state().greens.get(&c).copied()
}

/// The green context of context `c`'s handle, if it is one.
pub fn green_of(c: u64) -> Option<u64> {
    is_green(c).then_some(c | GREEN_BIT)
}

/// The context of green context `g`.
fn context_of(g: u64) -> CuRes<(u64, u32)> {
    let c = g & !GREEN_BIT;
    if g & GREEN_BIT == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_HANDLE);
    }
    state()
        .greens
        .get(&c)
        .map(|&sms| (c, sms))
        .ok_or(cuda::CUDA_ERROR_INVALID_HANDLE)
}

/// The device's multiprocessors.
pub(crate) fn device_sms() -> CuRes<u32> {
    let n = drv::driver()?.attribute(cuda::attr::MULTIPROCESSOR_COUNT as i32)?;
    Ok(u32::try_from(n).unwrap_or(0))
}

/// The device's partition granularity ([`Granularity::of`] its compute capability).
pub(crate) fn granularity(flags: c_uint) -> CuRes<Granularity> {
    let major = drv::driver()?.attribute(cuda::attr::COMPUTE_CAPABILITY_MAJOR as i32)?;
    Ok(Granularity::of(major, flags))
}

/// The SMs of context `c` (the current one for 0): a green context's, or the device's.
fn context_sms(c: u64) -> CuRes<u32> {
    let c = if c == 0 { drv::ctx()? } else { c };
    if let Some(sms) = sms_of(c).or_else(|| crate::exec_affinity::sms_of(c)) {
        return Ok(sms);
    }
    // The host checks the context.
    drv::ctx_id(c)?;
    device_sms()
}

/// Writes the whole SM resource of `sms` SMs, or refuses another type.
fn write_whole(res: &mut [u8], ty: c_int, sms: u32) -> CuRes<()> {
    if u32::try_from(ty) != Ok(RESOURCE_TYPE_SM) {
        return Err(cuda::CUDA_ERROR_INVALID_RESOURCE_TYPE);
    }
    SmResource {
        sm_count: sms,
        origin: Origin::Whole,
        split: 0,
    }
    .write(res, granularity(0)?);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDevResource(
    dev: CUdevice,
    res: *mut c_void,
    ty: c_int,
) -> CUresult {
    ffi("cuDeviceGetDevResource", || {
        drv::driver()?;
        drv::check_device(dev)?;
        write_whole(out_bytes!(res, RESOURCE_BYTES), ty, device_sms()?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevResource(
    ctx: CUhandle,
    res: *mut c_void,
    ty: c_int,
) -> CUresult {
    ffi("cuCtxGetDevResource", || {
        let sms = context_sms(h(ctx))?;
        write_whole(out_bytes!(res, RESOURCE_BYTES), ty, sms)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGreenCtxGetDevResource(
    g: CUhandle,
    res: *mut c_void,
    ty: c_int,
) -> CUresult {
    ffi("cuGreenCtxGetDevResource", || {
        drv::driver()?;
        let (_, sms) = context_of(h(g))?;
        write_whole(out_bytes!(res, RESOURCE_BYTES), ty, sms)
    })
}

/// `cuStreamGetDevResource` (CUDA 13): the resources of the stream's context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetDevResource(
    stream: CUhandle,
    res: *mut c_void,
    ty: c_int,
) -> CUresult {
    ffi("cuStreamGetDevResource", || {
        let sms = context_sms(drv::stream_context(h(stream))?)?;
        write_whole(out_bytes!(res, RESOURCE_BYTES), ty, sms)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevSmResourceSplitByCount(
    result: *mut c_void,
    nb_groups: *mut c_uint,
    input: *const c_void,
    remainder: *mut c_void,
    flags: c_uint,
    min_count: c_uint,
) -> CUresult {
    ffi("cuDevSmResourceSplitByCount", || {
        drv::driver()?;
        let known = SPLIT_IGNORE_SM_COSCHEDULING | SPLIT_MAX_POTENTIAL_CLUSTER_SIZE;
        if nb_groups.is_null() || flags & !known != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let major = drv::driver()?.attribute(cuda::attr::COMPUTE_CAPABILITY_MAJOR as i32)?;
        if flags & SPLIT_MAX_POTENTIAL_CLUSTER_SIZE != 0 && major < CLUSTERS_MAJOR {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let g = Granularity::of(major, flags);
        let input = SmResource::read(in_bytes!(input, RESOURCE_BYTES))?;
        // SAFETY: checked non-NULL above; the CUDA contract makes it a valid unsigned int.
        let asked = unsafe { *nb_groups };
        let wanted = if result.is_null() {
            None
        } else if asked == 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        } else {
            Some(asked)
        };
        let s = split(input, min_count, g, wanted)?;
        let id = next_split();
        if wanted.is_some() {
            let out = out_bytes!(result, RESOURCE_BYTES * s.groups as usize);
            for chunk in out.chunks_exact_mut(RESOURCE_BYTES) {
                SmResource {
                    sm_count: s.size,
                    origin: Origin::Group,
                    split: id,
                }
                .write(chunk, g);
            }
        }
        if !remainder.is_null() {
            SmResource {
                sm_count: s.remainder,
                origin: Origin::Remainder,
                split: id,
            }
            .write(out_bytes!(remainder, RESOURCE_BYTES), g);
        }
        out!(nb_groups, s.groups)
    })
}

/// `cuDevSmResourceSplit` (CUDA 13): groups of explicit sizes, in order.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevSmResourceSplit(
    result: *mut c_void,
    nb_groups: c_uint,
    input: *const c_void,
    remainder: *mut c_void,
    flags: c_uint,
    group_params: *mut c_void,
) -> CUresult {
    ffi("cuDevSmResourceSplit", || {
        drv::driver()?;
        if nb_groups == 0 || flags != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let major = drv::driver()?.attribute(cuda::attr::COMPUTE_CAPABILITY_MAJOR as i32)?;
        let g = Granularity::of(major, 0);
        let input = SmResource::read(in_bytes!(input, RESOURCE_BYTES))?;
        let n = nb_groups as usize;
        let params = out_bytes!(group_params, GROUP_PARAMS_BYTES * n);
        let asked: Vec<GroupParams> = params
            .chunks_exact(GROUP_PARAMS_BYTES)
            .map(GroupParams::read)
            .collect();
        let (counts, left) = split_structured(input, &asked, g, major, !result.is_null())?;
        let id = next_split();
        for (entry, &count) in params.chunks_exact_mut(GROUP_PARAMS_BYTES).zip(&counts) {
            // Discovered counts are filled in.
            entry[..4].copy_from_slice(&count.to_le_bytes());
        }
        if !result.is_null() {
            let out = out_bytes!(result, RESOURCE_BYTES * n);
            for (chunk, &count) in out.chunks_exact_mut(RESOURCE_BYTES).zip(&counts) {
                SmResource {
                    sm_count: count,
                    origin: Origin::Group,
                    split: id,
                }
                .write(chunk, g);
            }
        }
        if !remainder.is_null() {
            let out = out_bytes!(remainder, RESOURCE_BYTES);
            SmResource {
                sm_count: left,
                origin: Origin::Remainder,
                split: id,
            }
            .write(out, g);
            if left == 0 {
                // No SMs left: CUDA's remainder is then of type INVALID.
                out[at::TYPE..at::TYPE + 4].copy_from_slice(&0u32.to_le_bytes());
            }
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevResourceGenerateDesc(
    desc: *mut CUhandle,
    resources: *const c_void,
    nb: c_uint,
) -> CUresult {
    ffi("cuDevResourceGenerateDesc", || {
        drv::driver()?;
        if desc.is_null() || nb == 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = in_bytes!(resources, RESOURCE_BYTES * nb as usize);
        let pieces = bytes
            .chunks_exact(RESOURCE_BYTES)
            .map(SmResource::read)
            .collect::<CuRes<Vec<_>>>()?;
        let sms = combine(&pieces)?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let handle = DESC_BASE | (NEXT.fetch_add(1, Ordering::Relaxed) + 1) << 4;
        state().descs.insert(handle, sms);
        out!(desc, p(handle))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGreenCtxCreate(
    pg: *mut CUhandle,
    desc: CUhandle,
    dev: CUdevice,
    flags: c_uint,
) -> CUresult {
    ffi("cuGreenCtxCreate", || {
        let d = drv::driver()?;
        drv::check_device(dev)?;
        if pg.is_null() || flags != GREEN_CTX_DEFAULT_STREAM {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let sms = *state()
            .descs
            .get(&h(desc))
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        let c = d
            .call(
                &msg::GreenCtxCreate {
                    device: 0,
                    sm_count: sms,
                },
                &[],
            )?
            .handle;
        state().greens.insert(c, sms);
        out!(pg, p(c | GREEN_BIT))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGreenCtxDestroy(g: CUhandle) -> CUresult {
    ffi("cuGreenCtxDestroy", || {
        drv::driver()?;
        let (c, _) = context_of(h(g))?;
        drv::ctx_destroy(c)?;
        state().greens.remove(&c);
        // It held the primary context: its destroy may have been the last reference.
        drv::primary_released_elsewhere()
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxFromGreenCtx(pctx: *mut CUhandle, g: CUhandle) -> CUresult {
    ffi("cuCtxFromGreenCtx", || {
        drv::driver()?;
        let (c, _) = context_of(h(g))?;
        out!(pctx, p(c))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGreenCtxStreamCreate(
    ps: *mut CUhandle,
    g: CUhandle,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    ffi("cuGreenCtxStreamCreate", || {
        drv::driver()?;
        let (c, _) = context_of(h(g))?;
        if ps.is_null() || flags != STREAM_NON_BLOCKING {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(ps, p(drv::stream_create_in(c, flags, priority)?))
    })
}

/// `cuStreamGetGreenCtx`: the green context of the stream's context, or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetGreenCtx(stream: CUhandle, pg: *mut CUhandle) -> CUresult {
    ffi("cuStreamGetGreenCtx", || {
        let c = drv::stream_context(h(stream))?;
        out!(pg, green_of(c).map_or(std::ptr::null_mut(), p))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGreenCtxRecordEvent(g: CUhandle, event: CUhandle) -> CUresult {
    ffi("cuGreenCtxRecordEvent", || {
        drv::driver()?;
        let (c, _) = context_of(h(g))?;
        drv::ctx_record_event(c, h(event))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGreenCtxWaitEvent(g: CUhandle, event: CUhandle) -> CUresult {
    ffi("cuGreenCtxWaitEvent", || {
        drv::driver()?;
        let (c, _) = context_of(h(g))?;
        drv::ctx_wait_event(c, h(event))
    })
}

/// `cuGreenCtxGetId` (CUDA 12.9): its context's ID.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGreenCtxGetId(g: CUhandle, id: *mut c_ulonglong) -> CUresult {
    ffi("cuGreenCtxGetId", || {
        drv::driver()?;
        let (c, _) = context_of(h(g))?;
        out!(id, drv::ctx_id(c)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(sm_count: u32) -> SmResource {
        SmResource {
            sm_count,
            origin: Origin::Whole,
            split: 0,
        }
    }

    #[test]
    fn resources_round_trip_and_foreign_bytes_are_refused() {
        let mut b = [0xffu8; RESOURCE_BYTES];
        let r = SmResource {
            sm_count: 132,
            origin: Origin::Group,
            split: 7,
        };
        r.write(&mut b, Granularity::of(9, 0));
        assert_eq!(SmResource::read(&b), Ok(r));
        assert_eq!(&b[96..100], &132u32.to_le_bytes(), "sm.smCount");
        assert_eq!(&b[100..104], &8u32.to_le_bytes(), "sm.minSmPartitionSize");
        assert_eq!(&b[136..144], &[0; 8], "CUDA 13's nextResource is NULL");
        let mut forged = b;
        forged[at::MAGIC] ^= 1;
        assert_eq!(
            SmResource::read(&forged),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        let mut other = b;
        other[0] = 2;
        assert_eq!(
            SmResource::read(&other),
            Err(cuda::CUDA_ERROR_INVALID_RESOURCE_TYPE)
        );
    }

    #[test]
    fn splits_follow_the_architectures_granularity() {
        let g8 = Granularity::of(8, 0);
        // 108 SMs (an A100) in groups of at least 5: rounded up to 6, 18 groups.
        assert_eq!(
            split(whole(108), 5, g8, None),
            Ok(Split {
                groups: 18,
                size: 6,
                remainder: 0
            })
        );
        // At least 1 asked, 2 given (compute capability 8's minimum); 3 wanted.
        assert_eq!(
            split(whole(108), 1, g8, Some(3)),
            Ok(Split {
                groups: 3,
                size: 2,
                remainder: 102
            })
        );
        // Hopper: eights.
        assert_eq!(
            split(whole(132), 20, Granularity::of(9, 0), None),
            Ok(Split {
                groups: 5,
                size: 24,
                remainder: 12
            })
        );
        // Ignoring co-scheduling: single SMs.
        let fine = Granularity::of(9, SPLIT_IGNORE_SM_COSCHEDULING);
        assert_eq!(split(whole(8), 3, fine, None).map(|s| s.groups), Ok(2));
        // Too few SMs for one group: none, all left over.
        assert_eq!(
            split(whole(1), 0, g8, None),
            Ok(Split {
                groups: 0,
                size: 2,
                remainder: 1
            })
        );
        assert_eq!(
            split(whole(8), 9, g8, None),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        let piece = SmResource {
            sm_count: 4,
            origin: Origin::Group,
            split: 3,
        };
        assert_eq!(
            split(piece, 1, g8, None),
            Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION),
            "a split's pieces are split again only through a green context"
        );
    }

    #[test]
    fn structured_splits_take_explicit_and_discovered_counts_in_order() {
        let g8 = Granularity::of(8, 0);
        let g9 = Granularity::of(9, 0);
        let p = |sm_count, coscheduled, flags| GroupParams {
            sm_count,
            coscheduled,
            flags,
            locality_domain: 0,
        };
        // cuda.h's example 3 on 132 SMs: 8 in fours, then everything else.
        assert_eq!(
            split_structured(
                whole(132),
                &[p(8, 4, 0), p(0, 2, GROUP_BACKFILL)],
                g9,
                9,
                true
            ),
            Ok((vec![8, 124], 0))
        );
        // Example 1: discover without a constraint; the rest is the remainder.
        assert_eq!(
            split_structured(whole(9), &[p(0, 0, 0)], g8, 8, true),
            Ok((vec![8], 1))
        );
        // Example 2: ten SMs in twos.
        assert_eq!(
            split_structured(whole(16), &[p(10, 2, 0)], g8, 8, true),
            Ok((vec![10], 6))
        );
        // Discovery of nothing: only without results.
        assert_eq!(
            split_structured(whole(8), &[p(8, 0, 0), p(0, 0, 0)], g8, 8, false),
            Ok((vec![8, 0], 0))
        );
        assert_eq!(
            split_structured(whole(8), &[p(8, 0, 0), p(0, 0, 0)], g8, 8, true),
            Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)
        );
        let invalid = cuda::CUDA_ERROR_INVALID_VALUE;
        for (bad, why) in [
            (p(3, 0, 0), "odd"),
            (p(9, 0, 0), "more than the input"),
            (p(12, 8, 0), "not a multiple of the co-scheduled count"),
            (p(4, 4, 0), "co-scheduled count above 2 before 9.0"),
            (p(4, 0, 0x80), "unknown flag"),
        ] {
            assert_eq!(
                split_structured(whole(8), &[bad], g8, 8, true),
                Err(invalid),
                "{why}"
            );
        }
        assert_eq!(
            split_structured(whole(132), &[p(12, 8, GROUP_BACKFILL)], g9, 9, true),
            Ok((vec![12], 120)),
            "backfill lifts the multiple"
        );
        assert_eq!(
            split_structured(whole(8), &[p(6, 0, 0), p(4, 0, 0)], g8, 8, true),
            Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION),
            "not enough left for the second"
        );
        let located = GroupParams {
            locality_domain: 1,
            ..p(2, 0, GROUP_LOCALITY_DOMAIN_ID)
        };
        assert_eq!(
            split_structured(whole(8), &[located], g8, 8, true),
            Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)
        );
        let any = GroupParams {
            locality_domain: LOCALITY_DOMAIN_ANY,
            ..located
        };
        assert_eq!(
            split_structured(whole(8), &[any], g8, 8, true),
            Ok((vec![2], 6))
        );
        let rest = SmResource {
            sm_count: 6,
            origin: Origin::Remainder,
            split: 2,
        };
        assert_eq!(
            split_structured(rest, &[p(2, 0, 0)], g8, 8, true),
            Ok((vec![2], 4)),
            "a remainder splits again"
        );
    }

    #[test]
    fn descriptors_combine_pieces_of_one_split_only() {
        let piece = |split, sm_count| SmResource {
            sm_count,
            origin: Origin::Group,
            split,
        };
        assert_eq!(combine(&[piece(4, 2), piece(4, 2)]), Ok(4));
        assert_eq!(combine(&[whole(16)]), Ok(16));
        assert_eq!(
            combine(&[piece(4, 2), piece(5, 2)]),
            Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)
        );
        assert_eq!(
            combine(&[whole(8), whole(8)]),
            Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)
        );
        assert_eq!(
            combine(&[piece(4, 0)]),
            Err(cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)
        );
        assert_eq!(combine(&[]), Err(cuda::CUDA_ERROR_INVALID_VALUE));
    }
}
