//! Per-device counters, updated by the queue and session threads and readable from any thread.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

macro_rules! counters {
    ($(#[$doc:meta] $name:ident),* $(,)?) => {
        /// Live counters of one virtio-vgpu device. All updates are relaxed atomics; read them
        /// with [`VgpuDevStats::snapshot`].
        #[derive(Debug, Default)]
        pub struct VgpuDevStats {
            $($name: AtomicU64,)*
        }

        /// A point-in-time copy of [`VgpuDevStats`].
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
        pub struct VgpuDevStatsSnapshot {
            $(#[$doc] pub $name: u64,)*
        }

        impl VgpuDevStats {
            /// Copies all counters.
            pub fn snapshot(&self) -> VgpuDevStatsSnapshot {
                VgpuDevStatsSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

counters! {
    /// Sessions open now (a guest file descriptor of the device each).
    sessions_open,
    /// Sessions opened since vgpud started.
    sessions_total,
    /// Protocol frames executed.
    calls,
    /// Synchronous frames the queue thread ran itself, its session's thread being idle and the frame answered at once (one thread wake-up less each; counted in `calls` too).
    calls_on_queue_thread,
    /// `BATCH` requests taken (several asynchronous frames in one chain).
    batches,
    /// Request bulk bytes read straight from guest pages (host to device).
    bytes_from_guest,
    /// Reply bulk bytes written straight into guest pages (device to host).
    bytes_to_guest,
    /// Guest-physical ranges (descriptors) the request bulk bytes came in (`bytes_from_guest` / this = the average physically contiguous run of the guest's buffers).
    segments_from_guest,
    /// Guest-physical ranges the reply bulk bytes were written to.
    segments_to_guest,
    /// Descriptor chains refused as malformed or hostile (outside RAM, overlapping, …).
    dropped_chains,
    /// Requests answered with an error status (bad header, unknown session, …).
    refused_requests,
    /// Completions discarded because the device was reset while they ran.
    stale_completions,
    /// Device resets: VMM disconnects, `RESET_DEVICE`, queues stopped idle or restarted afresh.
    device_resets,
    /// Pauses: the VMM stopped the queues with sessions open (VM paused, or a driver reset).
    pauses,
    /// Pauses that ended with the queues running where they stopped (the sessions went on).
    resumes,
    /// VMM (vhost-user frontend) connections accepted.
    frontend_connections,
    /// Times the device stopped taking chains because the guest had as many in flight as both queues hold (only a guest that reposts chains it has not got back gets there).
    in_flight_throttles,
}

impl VgpuDevStats {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn session_opened(&self) {
        Self::add(&self.sessions_open, 1);
        Self::add(&self.sessions_total, 1);
    }

    pub(crate) fn session_closed(&self) {
        // Never wraps below zero even if a caller double-counts.
        let _ = self
            .sessions_open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(1))
            });
    }

    pub(crate) fn add_call(&self) {
        Self::add(&self.calls, 1);
    }

    pub(crate) fn add_calls(&self, n: usize) {
        Self::add(&self.calls, n as u64);
    }

    pub(crate) fn add_call_on_queue_thread(&self) {
        Self::add(&self.calls_on_queue_thread, 1);
    }

    pub(crate) fn add_batch(&self) {
        Self::add(&self.batches, 1);
    }

    pub(crate) fn add_from_guest(&self, bytes: u64, segments: u64) {
        Self::add(&self.bytes_from_guest, bytes);
        Self::add(&self.segments_from_guest, segments);
    }

    pub(crate) fn add_to_guest(&self, bytes: u64, segments: u64) {
        Self::add(&self.bytes_to_guest, bytes);
        Self::add(&self.segments_to_guest, segments);
    }

    pub(crate) fn add_dropped_chain(&self) {
        Self::add(&self.dropped_chains, 1);
    }

    pub(crate) fn add_throttle(&self) {
        Self::add(&self.in_flight_throttles, 1);
    }

    pub(crate) fn add_refused(&self) {
        Self::add(&self.refused_requests, 1);
    }

    pub(crate) fn add_stale(&self) {
        Self::add(&self.stale_completions, 1);
    }

    pub(crate) fn add_device_reset(&self) {
        Self::add(&self.device_resets, 1);
    }

    pub(crate) fn add_pause(&self) {
        Self::add(&self.pauses, 1);
    }

    pub(crate) fn add_resume(&self) {
        Self::add(&self.resumes, 1);
    }

    pub(crate) fn add_frontend_connection(&self) {
        Self::add(&self.frontend_connections, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_reflects_updates_and_open_count_never_underflows() {
        let s = VgpuDevStats::default();
        s.session_opened();
        s.session_closed();
        s.session_closed();
        s.add_from_guest(10, 2);
        s.add_dropped_chain();
        let snap = s.snapshot();
        assert_eq!((snap.sessions_open, snap.sessions_total), (0, 1));
        assert_eq!((snap.bytes_from_guest, snap.segments_from_guest), (10, 2));
        let json = serde_json::to_string(&snap).unwrap();
        assert!(json.contains("\"dropped_chains\":1"), "{json}");
    }
}
