//! vgpud runs for months while VMs come and go: a VMM connection must not leave descriptors
//! behind. (Alone in its test binary, so no other test opens descriptors meanwhile.)

use std::sync::Arc;
use std::time::Duration;

use vgpu_vmm_testutils::vsock::{EchoConnector, GuestOptions, TestServer};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn vmm_reconnects_do_not_leak_descriptors() {
    let server = TestServer::start(Arc::new(EchoConnector(5)), |_| {}).unwrap();
    let mut counts = Vec::new();
    for i in 0..12u64 {
        let guest = server.guest(GuestOptions::default()).unwrap();
        let s = guest.connect(5).unwrap();
        s.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        drop(s);
        guest.disconnect();
        drop(guest);
        server
            .wait_stats(Duration::from_secs(10), |st| st.device_resets == i + 1)
            .unwrap();
        // The guest's interrupt thread lets go of its handle within one poll slice.
        std::thread::sleep(Duration::from_millis(60));
        counts.push(open_fds());
    }
    // The first rounds may warm up lazily created descriptors; after that the count is flat.
    assert_eq!(
        counts[4], counts[11],
        "descriptors leak per VMM connection: {counts:?}"
    );
}
