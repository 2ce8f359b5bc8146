//! The process-wide tables of export tokens: random 128-bit names of memory, events and pools a
//! process exported, looked up by the process that opens or imports them (which checks that the
//! exporter is of its own VM). Each kind of export has a table of its own.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Exports of one kind by token.
pub(super) struct TokenTable<V> {
    map: OnceLock<Mutex<HashMap<u128, V>>>,
}

impl<V> TokenTable<V> {
    /// An empty table (for a `static`).
    pub(super) const fn new() -> Self {
        Self {
            map: OnceLock::new(),
        }
    }

    /// The table, locked.
    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<u128, V>> {
        self.map
            .get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A token no entry holds (never 0).
    pub(super) fn fresh(&self) -> u128 {
        let t = self.lock();
        fresh_in(&t)
    }

    /// Enters what `make` builds for a fresh token, under one lock; returns the token.
    pub(super) fn enter(&self, make: impl FnOnce(u128) -> V) -> u128 {
        let mut t = self.lock();
        let token = fresh_in(&t);
        t.insert(token, make(token));
        token
    }

    /// Forgets `token`.
    pub(super) fn forget(&self, token: u128) {
        self.lock().remove(&token);
    }
}

fn fresh_in<V>(t: &HashMap<u128, V>) -> u128 {
    loop {
        let token = super::vmm::random_token();
        if token != 0 && !t.contains_key(&token) {
            return token;
        }
    }
}
