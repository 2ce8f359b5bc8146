//! Per-device counters, updated by the device thread and readable from any thread.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Live counters of one vsock device. All updates are relaxed atomics; read them with
/// [`VsockStats::snapshot`].
#[derive(Debug, Default)]
pub struct VsockStats {
    connections_open: AtomicU64,
    connections_total: AtomicU64,
    connections_refused: AtomicU64,
    bytes_guest_to_host: AtomicU64,
    bytes_host_to_guest: AtomicU64,
    rst_sent: AtomicU64,
    device_resets: AtomicU64,
    frontend_connections: AtomicU64,
    dropped_chains: AtomicU64,
    large_ring_bytes: AtomicU64,
    calls_on_device_thread: AtomicU64,
    bytes_lent_in_place: AtomicU64,
    bytes_filled_in_place: AtomicU64,
    lost_wakeups: AtomicU64,
}

/// A point-in-time copy of [`VsockStats`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VsockStatsSnapshot {
    /// Connections currently open.
    pub connections_open: u64,
    /// Connections established since vgpud started (guest- and host-initiated).
    pub connections_total: u64,
    /// Connection attempts refused (no listener, connector refusal, limits, guest not ready).
    pub connections_refused: u64,
    /// Payload bytes delivered from the guest to host streams.
    pub bytes_guest_to_host: u64,
    /// Payload bytes delivered from host streams to the guest.
    pub bytes_host_to_guest: u64,
    /// RST packets sent to the guest.
    pub rst_sent: u64,
    /// Device resets: VMM disconnects and `VHOST_USER_RESET_DEVICE` (guest reboot / driver reset).
    pub device_resets: u64,
    /// VMM (vhost-user frontend) connections accepted.
    pub frontend_connections: u64,
    /// Malformed or hostile descriptor chains dropped.
    pub dropped_chains: u64,
    /// Bytes of large in-process rings reserved now (at most
    /// [`MAX_LARGE_RING_BYTES`](crate::MAX_LARGE_RING_BYTES)).
    pub large_ring_bytes: u64,
    /// Calls an in-process endpoint's answerer answered on the device thread (quick calls of
    /// an idle session, see [`vgpu_proto::frame::AnswerHere`]).
    pub calls_on_device_thread: u64,
    /// Guest payload bytes the device thread handed from tx descriptor memory straight to a
    /// session reading them in place (a large host-to-device copy: no ring in between, see
    /// [`vgpu_proto::frame::ReadInPlace`]); also counted in `bytes_guest_to_host`.
    pub bytes_lent_in_place: u64,
    /// Session bytes produced straight in rx descriptor memory by the device thread (a large
    /// device-to-host copy's data, read from device memory with no ring in between, see
    /// [`vgpu_proto::frame::WriteInPlace`]); also counted in `bytes_host_to_guest`.
    pub bytes_filled_in_place: u64,
    /// Wake-ups between the device and in-process sessions that the device's periodic audit
    /// found lost and made up for (each also logged); 0 in a healthy device.
    pub lost_wakeups: u64,
}

impl VsockStats {
    /// Copies all counters.
    pub fn snapshot(&self) -> VsockStatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        VsockStatsSnapshot {
            connections_open: get(&self.connections_open),
            connections_total: get(&self.connections_total),
            connections_refused: get(&self.connections_refused),
            bytes_guest_to_host: get(&self.bytes_guest_to_host),
            bytes_host_to_guest: get(&self.bytes_host_to_guest),
            rst_sent: get(&self.rst_sent),
            device_resets: get(&self.device_resets),
            frontend_connections: get(&self.frontend_connections),
            dropped_chains: get(&self.dropped_chains),
            large_ring_bytes: get(&self.large_ring_bytes),
            calls_on_device_thread: get(&self.calls_on_device_thread),
            bytes_lent_in_place: get(&self.bytes_lent_in_place),
            bytes_filled_in_place: get(&self.bytes_filled_in_place),
            lost_wakeups: get(&self.lost_wakeups),
        }
    }

    pub(crate) fn connection_opened(&self) {
        self.connections_open.fetch_add(1, Ordering::Relaxed);
        self.connections_total.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connections_closed(&self, n: u64) {
        // Never wraps below zero even if a caller double-counts.
        let _ = self
            .connections_open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
    }

    pub(crate) fn add_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_guest_to_host(&self, n: u64) {
        self.bytes_guest_to_host.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_host_to_guest(&self, n: u64) {
        self.bytes_host_to_guest.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_rst_sent(&self) {
        self.rst_sent.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_device_reset(&self) {
        self.device_resets.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_frontend_connection(&self) {
        self.frontend_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Calls answered on the device thread so far (`calls_on_device_thread`).
    pub fn calls_on_device_thread(&self) -> u64 {
        self.calls_on_device_thread.load(Ordering::Relaxed)
    }

    pub(crate) fn add_calls_on_device_thread(&self, n: u64) {
        self.calls_on_device_thread.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_bytes_lent_in_place(&self, n: u64) {
        self.bytes_lent_in_place.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_bytes_filled_in_place(&self, n: u64) {
        self.bytes_filled_in_place.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_lost_wakeup(&self) {
        self.lost_wakeups.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_dropped_chain(&self) {
        self.dropped_chains.fetch_add(1, Ordering::Relaxed);
    }

    /// Reserves `bytes` of the large-ring budget if the reservation stays within `limit`.
    pub(crate) fn try_reserve_large_ring(&self, bytes: u64, limit: u64) -> bool {
        self.large_ring_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                v.checked_add(bytes).filter(|&n| n <= limit)
            })
            .is_ok()
    }

    pub(crate) fn release_large_ring(&self, bytes: u64) {
        let _ = self
            .large_ring_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(bytes))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_reflects_updates_and_open_count_never_underflows() {
        let s = VsockStats::default();
        s.connection_opened();
        s.connection_opened();
        s.connections_closed(1);
        s.connections_closed(5);
        s.add_guest_to_host(10);
        s.add_host_to_guest(20);
        s.add_dropped_chain();
        let snap = s.snapshot();
        assert_eq!(snap.connections_open, 0);
        assert_eq!(snap.connections_total, 2);
        assert_eq!(snap.bytes_guest_to_host, 10);
        assert_eq!(snap.bytes_host_to_guest, 20);
        assert_eq!(snap.dropped_chains, 1);
        let json = serde_json::to_string(&snap).unwrap();
        assert!(json.contains("\"dropped_chains\":1"), "{json}");
    }
}
