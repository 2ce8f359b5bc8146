//! Context-local storage: values NVIDIA's runtime keeps per context through
//! the driver's private storage table, with a destructor the driver calls
//! when the context goes away (destroyed, or a primary context reset or
//! released for the last time). The runtime keeps its per-context state
//! (registered modules, functions) here, so a reset runtime re-registers
//! everything in the new context.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex, MutexGuard};

/// The destructor the runtime registers: `(context, key, value)`.
pub type Destructor = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void);

/// Most values one process may store: the runtime uses a handful per
/// context; a flood is refused rather than grown without bound.
pub const MAX_ENTRIES: usize = 4096;

#[derive(Clone, Copy)]
struct Entry {
    value: usize,
    destructor: Option<Destructor>,
}

type Store = HashMap<(u64, usize), Entry>;

fn store() -> MutexGuard<'static, Store> {
    static STORE: LazyLock<Mutex<Store>> = LazyLock::new(|| Mutex::new(HashMap::new()));
    STORE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Stores `value` under `key` in context `ctx`; false when the store is full.
pub fn put(ctx: u64, key: usize, value: usize, destructor: Option<Destructor>) -> bool {
    let mut s = store();
    if s.len() >= MAX_ENTRIES && !s.contains_key(&(ctx, key)) {
        return false;
    }
    s.insert((ctx, key), Entry { value, destructor });
    true
}

/// The value under `key` in `ctx`.
pub fn get(ctx: u64, key: usize) -> Option<usize> {
    store().get(&(ctx, key)).map(|e| e.value)
}

/// Removes `key` from `ctx` without calling its destructor; false when absent.
pub fn delete(ctx: u64, key: usize) -> bool {
    store().remove(&(ctx, key)).is_some()
}

/// `ctx` is gone: removes its values and calls their destructors (outside
/// the lock: a destructor may call back into the driver).
pub fn context_gone(ctx: u64) {
    let gone: Vec<((u64, usize), Entry)> = {
        let mut s = store();
        let keys: Vec<_> = s.keys().filter(|(c, _)| *c == ctx).copied().collect();
        keys.into_iter()
            .filter_map(|k| s.remove(&k).map(|e| (k, e)))
            .collect()
    };
    for ((c, key), e) in gone {
        if let Some(d) = e.destructor {
            crate::debug!("context-local storage: destructor for key {key:#x} of context {c:#x}");
            // SAFETY: the runtime registered `d` for this (context, key, value) and expects it to be
            // called once when the context goes away; the arguments are the ones it stored.
            unsafe { d(c as *mut c_void, key as *mut c_void, e.value as *mut c_void) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static CALLED: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn count(_: *mut c_void, key: *mut c_void, value: *mut c_void) {
        CALLED.fetch_add(key as usize + value as usize, Ordering::SeqCst);
    }

    #[test]
    fn values_live_per_context_until_it_goes() {
        let (a, b) = (0x7000_0001, 0x7000_0002);
        assert!(put(a, 1, 10, Some(count)));
        assert!(put(b, 1, 20, None));
        assert_eq!(get(a, 1), Some(10));
        assert_eq!(get(b, 1), Some(20));
        assert_eq!(get(a, 2), None);
        context_gone(a);
        assert_eq!(CALLED.load(Ordering::SeqCst), 11);
        assert_eq!(get(a, 1), None);
        assert_eq!(get(b, 1), Some(20));
        assert!(delete(b, 1));
        assert!(!delete(b, 1));
        context_gone(b);
        assert_eq!(
            CALLED.load(Ordering::SeqCst),
            11,
            "deleted values are not destroyed"
        );
    }
}
