//! Fixtures for tests of the broker and of crates built on it: an in-memory
//! device (so broker logic is tested without the simulated GPU, which depends
//! on this crate), a protocol test client, a config helper, and memfds with the
//! client's own mappings of them (shared host memory).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vgpu_proto::frame::{self, FLAG_ASYNC};
use vgpu_proto::msg::{self, Op};

use crate::device::{Device, DeviceContext, DeviceError, DeviceInfo};
use vgpu_config::{Priority, VmConfig};

/// Base address of the in-memory device's allocations.
pub const MEM_DEVICE_BASE: u64 = 0x7000_0000_0000;
/// Alignment of its allocations.
pub const MEM_DEVICE_ALIGN: u64 = 256;

#[derive(Default)]
struct MemState {
    next: u64,
    allocs: BTreeMap<u64, Vec<u8>>,
    used: u64,
    /// Texture and surface objects: handles counted up from 1 (they name nothing here).
    last_object: u64,
    objects: std::collections::BTreeSet<u64>,
}

/// A device whose memory is host vectors; each operation can be slowed down
/// to make asynchronous behaviour observable.
pub struct MemDevice {
    info: DeviceInfo,
    state: Arc<Mutex<MemState>>,
    delay: Duration,
}

/// The multiprocessors a [`MemDevice`] reports.
pub const MEM_DEVICE_SMS: i32 = 8;

impl MemDevice {
    /// A device of `total` bytes whose operations each take `delay`.
    pub fn new(total: u64, delay: Duration) -> Self {
        let mut attributes = vec![0; vgpu_proto::cuda::attr::COUNT];
        attributes[vgpu_proto::cuda::attr::WARP_SIZE] = 32;
        attributes[vgpu_proto::cuda::attr::MULTIPROCESSOR_COUNT] = MEM_DEVICE_SMS;
        Self {
            info: DeviceInfo {
                name: "vgpu test device".into(),
                kind: "sim",
                uuid: *b"0123456789abcdef",
                total_memory: total,
                alloc_granularity: MEM_DEVICE_ALIGN,
                attributes,
                watchdog: None,
            },
            state: Arc::new(Mutex::new(MemState {
                next: MEM_DEVICE_BASE,
                ..MemState::default()
            })),
            delay,
        }
    }
}

impl MemDevice {
    /// Texture and surface objects alive on the device.
    pub fn live_objects(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .objects
            .len()
    }
}

struct MemContext {
    state: Arc<Mutex<MemState>>,
    total: u64,
    delay: Duration,
}

impl MemContext {
    fn with<T>(
        &self,
        addr: u64,
        len: u64,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T, DeviceError> {
        std::thread::sleep(self.delay);
        let mut s = self.state.lock().expect("mem device lock");
        let bad = DeviceError::InvalidAddress { addr, len };
        let (&base, v) = s.allocs.range_mut(..=addr).next_back().ok_or(bad.clone())?;
        let off = (addr - base) as usize;
        let end = off.checked_add(len as usize).ok_or(bad.clone())?;
        if end > v.len() {
            return Err(bad);
        }
        Ok(f(&mut v[off..end]))
    }
}

impl Device for MemDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn open(&self, _tenant: &str) -> Result<Arc<dyn DeviceContext>, DeviceError> {
        Ok(Arc::new(MemContext {
            state: Arc::clone(&self.state),
            total: self.info.total_memory,
            delay: self.delay,
        }))
    }
    fn memory_used(&self) -> u64 {
        self.state.lock().expect("mem device lock").used
    }
}

impl DeviceContext for MemContext {
    /// Its kernels set no handles, so a graph's conditional nodes run on their defaults.
    fn sets_graph_conditionals(&self) -> bool {
        true
    }
    fn alloc(&self, size: u64) -> Result<u64, DeviceError> {
        let mut s = self.state.lock().expect("mem device lock");
        if s.used + size > self.total {
            return Err(DeviceError::OutOfMemory);
        }
        let ptr = s.next;
        s.next += size.div_ceil(MEM_DEVICE_ALIGN) * MEM_DEVICE_ALIGN;
        s.used += size;
        s.allocs.insert(ptr, vec![0; size as usize]);
        Ok(ptr)
    }
    fn free(&self, ptr: u64) -> Result<(), DeviceError> {
        let mut s = self.state.lock().expect("mem device lock");
        let v = s
            .allocs
            .remove(&ptr)
            .ok_or(DeviceError::InvalidAddress { addr: ptr, len: 0 })?;
        s.used -= v.len() as u64;
        Ok(())
    }
    fn write(&self, dst: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.with(dst, data.len() as u64, |m| m.copy_from_slice(data))
    }
    fn read(&self, src: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        self.with(src, out.len() as u64, |m| out.copy_from_slice(m))
    }
    fn copy(&self, dst: u64, src: u64, len: u64) -> Result<(), DeviceError> {
        let mut tmp = vec![0; len as usize];
        self.read(src, &mut tmp)?;
        self.write(dst, &tmp)
    }
    fn memset(&self, dst: u64, value: u32, elem_size: u32, count: u64) -> Result<(), DeviceError> {
        let pat = &value.to_le_bytes()[..elem_size as usize];
        self.with(dst, count * u64::from(elem_size), |m| {
            for c in m.chunks_mut(elem_size as usize) {
                c.copy_from_slice(pat);
            }
        })
    }
    fn texture_create(
        &self,
        _layout: &crate::texture::TexelLayout,
        _sampling: &crate::texture::TexSampling,
    ) -> Result<u64, DeviceError> {
        Ok(self.new_object())
    }
    fn texture_destroy(&self, handle: u64) -> Result<(), DeviceError> {
        self.drop_object(handle)
    }
    fn surface_create(&self, _layout: &crate::texture::TexelLayout) -> Result<u64, DeviceError> {
        Ok(self.new_object())
    }
    fn surface_destroy(&self, handle: u64) -> Result<(), DeviceError> {
        self.drop_object(handle)
    }
}

impl MemContext {
    fn new_object(&self) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.last_object += 1;
        let h = s.last_object;
        s.objects.insert(h);
        h
    }

    fn drop_object(&self, handle: u64) -> Result<(), DeviceError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.objects.remove(&handle) {
            Ok(())
        } else {
            Err(DeviceError::NotSupported(format!("no object {handle:#x}")))
        }
    }
}

/// A VM entry with defaults, for tests.
/// A memfd of `len` bytes, byte `i` holding `byte(i)`, with `seals` added: a buffer a client
/// shares with the broker.
pub fn memfd(len: u64, seals: libc::c_int, byte: impl Fn(u64) -> u8) -> OwnedFd {
    // SAFETY: a NUL-terminated name; the result is checked.
    let fd =
        unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut f = std::fs::File::from(fd);
    let bytes: Vec<u8> = (0..len).map(byte).collect();
    f.write_all(&bytes).unwrap();
    let fd = OwnedFd::from(f);
    // SAFETY: fcntl on our descriptor.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    assert_eq!(r, 0);
    fd
}

/// The client's own shared mapping of the first `len` bytes of `fd`; the caller unmaps it, or
/// leaves it to the end of the test process.
pub fn map_shared(fd: &OwnedFd, len: u64) -> NonNull<u8> {
    // SAFETY: a fresh shared mapping of the caller's descriptor, checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    NonNull::new(p.cast()).unwrap()
}

pub fn vm(name: &str, memory: u64) -> VmConfig {
    VmConfig {
        name: name.to_string(),
        device: "gpu0".to_string(),
        memory,
        weight: 1,
        priority: Priority::Normal,
        unix_socket: None,
        vhost_user_socket: None,
        guest_cid: None,
        vsock_uds_path: None,
        device_model: vgpu_config::DeviceModel::Vsock,
        schedule: Vec::new(),
        mode: vgpu_config::VmMode::Shared,
        profile: None,
        socket_owner: None,
        tuning: vgpu_config::VmTuning::default(),
        limits: vgpu_config::limits::VmLimits::default(),
        memory_policy: vgpu_config::VmMemory::default(),
    }
}

/// A minimal protocol client for tests: speaks frames over any stream.
pub struct TestClient<S: Read + Write> {
    /// The stream.
    pub stream: S,
    /// Flags of the last reply (`FLAG_OUTPUT` says device output waits).
    pub last_flags: u16,
    call_id: u64,
    payload: Vec<u8>,
}

/// A failed call: (CUresult, message).
pub type CallError = (u32, String);

impl<S: Read + Write> TestClient<S> {
    /// A client over `stream`; call [`TestClient::hello`] first.
    pub fn new(stream: S) -> Self {
        Self {
            stream,
            last_flags: 0,
            call_id: 0,
            payload: Vec::new(),
        }
    }

    /// Performs the handshake.
    pub fn hello(&mut self) -> Result<msg::HelloReply, CallError> {
        self.call(
            &msg::Hello {
                protocol_version: vgpu_proto::PROTOCOL_VERSION,
                pid: std::process::id(),
                shim_version: "test".into(),
                process_name: "test".into(),
            },
            &[],
        )
        .map(|(r, _)| r)
    }

    /// Creates a context on device 0: its handle.
    pub fn ctx_create(&mut self) -> Result<u64, CallError> {
        self.call(
            &msg::CtxCreate {
                device: 0,
                flags: 0,
            },
            &[],
        )
        .map(|(r, _)| r.handle)
    }

    /// Sends a synchronous request and waits for its reply.
    pub fn call<O: Op>(&mut self, req: &O, tail: &[u8]) -> Result<(O::Reply, Vec<u8>), CallError> {
        self.send(req, tail, 0)
            .map_err(|e| (u32::MAX, e.to_string()))?;
        let h = frame::read_frame(&mut self.stream, &mut self.payload)
            .map_err(|e| (u32::MAX, e.to_string()))?;
        assert!(
            h.is_reply() && h.call_id == self.call_id,
            "unexpected reply {h:?}"
        );
        self.last_flags = h.flags;
        if h.status != 0 {
            return Err((
                h.status,
                String::from_utf8_lossy(&self.payload).into_owned(),
            ));
        }
        let (r, t) =
            msg::decode_reply::<O>(&self.payload).map_err(|e| (u32::MAX, e.to_string()))?;
        Ok((r, t.to_vec()))
    }

    /// Sends a synchronous request without reading its reply (a guest that leaves mid-call).
    pub fn send_only<O: Op>(&mut self, req: &O, tail: &[u8]) -> std::io::Result<()> {
        self.send(req, tail, 0)
    }

    /// Sends an asynchronous request (no reply).
    pub fn post<O: Op>(&mut self, req: &O, tail: &[u8]) -> std::io::Result<()> {
        self.send(req, tail, FLAG_ASYNC)
    }

    fn send<O: Op>(&mut self, req: &O, tail: &[u8], flags: u16) -> std::io::Result<()> {
        self.call_id += 1;
        let mut p = Vec::new();
        req.encode(&mut p);
        frame::write_frame(
            &mut self.stream,
            O::OPCODE,
            flags,
            self.call_id,
            0,
            &[&p, tail],
        )?;
        self.stream.flush()
    }
}

/// A session of `tenant` on broker `b` (as a process of that VM opens one), served on a thread,
/// with a context created: the client and the context's handle.
pub fn serve_session(
    b: &Arc<crate::Broker>,
    tenant: &str,
) -> (TestClient<std::os::unix::net::UnixStream>, u64) {
    let (c, s) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
    let t = b.tenant(tenant).expect("a tenant of the broker");
    let b = Arc::clone(b);
    std::thread::spawn(move || crate::session_loop::serve(&b, t, &s, &s, "test"));
    let mut c = TestClient::new(c);
    c.hello().expect("the handshake");
    let ctx = c
        .call(
            &msg::CtxCreate {
                device: 0,
                flags: 0,
            },
            &[],
        )
        .expect("a context")
        .0
        .handle;
    (c, ctx)
}
