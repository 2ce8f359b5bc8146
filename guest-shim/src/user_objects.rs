//! User objects (`cuUserObjectCreate`, `cuUserObjectRetain`, `cuUserObjectRelease`) and the
//! references graphs hold on them (`cuGraphRetainUserObject`, `cuGraphReleaseUserObject`):
//! what CUDA graphs use to tie a resource's lifetime to the graphs and executable graphs that
//! use it (`cudaUserObjectCreate`).
//!
//! An object counts references; when the last goes, its destructor runs on the shim's
//! destructor thread (CUDA runs it asynchronously and forbids it CUDA calls, so it never runs
//! inside the releasing call, which may hold the graph registry). A graph's references go with
//! it (`cuGraphDestroy`); a clone holds references of its own, and so does an executable graph,
//! through the private copy of its graph it keeps until `cuGraphExecDestroy`.
#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Mutex, MutexGuard, OnceLock};

use vgpu_proto::cuda;

use crate::driver::CuRes;
use crate::exports::{CUhandle, CUhostFn, h};
use crate::ffi::{CUresult, ffi};
use crate::out;

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`: the only flag CUDA accepts (and requires).
pub const NO_DESTRUCTOR_SYNC: c_uint = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`: the caller's references move to the graph.
pub const GRAPH_MOVE: c_uint = 1;
/// The tag in every `CUuserObject` handle the shim hands out.
const HANDLE_TAG: u64 = 0x05e0_b000_0000_0000;
/// Most live user objects in one process (a flood gets `CUDA_ERROR_OUT_OF_MEMORY`).
pub const MAX_OBJECTS: usize = 1 << 20;

struct Object {
    /// The destructor's argument, as an address (the pointer belongs to the program).
    ptr: usize,
    destroy: unsafe extern "C" fn(*mut c_void),
    refs: u64,
}

#[derive(Default)]
struct Registry {
    last: u64,
    objects: HashMap<u64, Object>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// A destructor to run, with its argument.
type Destructor = (unsafe extern "C" fn(*mut c_void), usize);

/// The destructor thread's queue (started at the first object's end).
fn destructors() -> &'static Mutex<Sender<Destructor>> {
    static Q: OnceLock<Mutex<Sender<Destructor>>> = OnceLock::new();
    Q.get_or_init(|| {
        let (tx, rx) = channel::<Destructor>();
        let spawned = std::thread::Builder::new()
            .name("vgpu-user-objects".into())
            .spawn(move || {
                for (f, ptr) in rx {
                    // SAFETY: the program's destructor with the argument it registered with
                    // it (cuUserObjectCreate's contract).
                    unsafe { f(ptr as *mut c_void) };
                }
            });
        if let Err(e) = spawned {
            crate::warn!("cannot start the user object destructor thread: {e}");
        }
        Mutex::new(tx)
    })
}

/// Adds `count` references to `object`.
pub fn retain(object: u64, count: u64) -> CuRes<()> {
    let mut r = registry();
    let o = r
        .objects
        .get_mut(&object)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    o.refs = o
        .refs
        .checked_add(count)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    Ok(())
}

/// Drops `count` references to `object`; the last one queues its destructor.
pub fn release(object: u64, count: u64) -> CuRes<()> {
    let gone = {
        let mut r = registry();
        let o = r
            .objects
            .get_mut(&object)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        if count > o.refs {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        o.refs -= count;
        if o.refs > 0 {
            return Ok(());
        }
        r.objects.remove(&object)
    };
    if let Some(o) = gone {
        let q = destructors().lock().unwrap_or_else(|p| p.into_inner());
        if q.send((o.destroy, o.ptr)).is_err() {
            crate::warn!("the user object destructor thread has gone; a destructor did not run");
        }
    }
    Ok(())
}

/// Whether `object` is a live user object.
pub fn exists(object: u64) -> bool {
    registry().objects.contains_key(&object)
}

fn create(ptr: *mut c_void, destroy: CUhostFn, refs: c_uint, flags: c_uint) -> CuRes<u64> {
    let destroy = destroy.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    if refs == 0 || flags != NO_DESTRUCTOR_SYNC {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let mut r = registry();
    if r.objects.len() >= MAX_OBJECTS {
        return Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
    }
    r.last += 1;
    let handle = HANDLE_TAG | r.last;
    r.objects.insert(
        handle,
        Object {
            ptr: ptr as usize,
            destroy,
            refs: u64::from(refs),
        },
    );
    Ok(handle)
}

fn positive(count: c_uint) -> CuRes<u64> {
    if count == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(u64::from(count))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuUserObjectCreate(
    out: *mut CUhandle,
    ptr: *mut c_void,
    destroy: CUhostFn,
    initial_refcount: c_uint,
    flags: c_uint,
) -> CUresult {
    ffi("cuUserObjectCreate", || {
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = create(ptr, destroy, initial_refcount, flags)?;
        out!(out, handle as CUhandle)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuUserObjectRetain(object: CUhandle, count: c_uint) -> CUresult {
    ffi("cuUserObjectRetain", || retain(h(object), positive(count)?))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuUserObjectRelease(object: CUhandle, count: c_uint) -> CUresult {
    ffi("cuUserObjectRelease", || {
        release(h(object), positive(count)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphRetainUserObject(
    graph: CUhandle,
    object: CUhandle,
    count: c_uint,
    flags: c_uint,
) -> CUresult {
    ffi("cuGraphRetainUserObject", || {
        let count = positive(count)?;
        if flags & !GRAPH_MOVE != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let mut reg = crate::graph::registry();
        let g = reg.graph_mut(h(graph))?;
        if flags & GRAPH_MOVE == 0 {
            retain(h(object), count)?;
        } else if !exists(h(object)) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        *g.user_objects.entry(h(object)).or_insert(0) += count;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphReleaseUserObject(
    graph: CUhandle,
    object: CUhandle,
    count: c_uint,
) -> CUresult {
    ffi("cuGraphReleaseUserObject", || {
        let count = positive(count)?;
        let mut reg = crate::graph::registry();
        let g = reg.graph_mut(h(graph))?;
        let held = g
            .user_objects
            .get_mut(&h(object))
            .filter(|n| **n >= count)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        *held -= count;
        if *held == 0 {
            g.user_objects.remove(&h(object));
        }
        release(h(object), count)
    })
}
