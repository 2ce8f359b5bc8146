//! The remoting benchmarks' baseline: a broker session of the benchmark's VM called directly, in
//! the benchmark's process, without transport or encoding.
//!
//! Its calls are functions of their own, never inlined, so that callgrind can count the broker's
//! instructions per call alone (`scripts/percall.sh`, docs/performance.md).

use std::sync::Arc;

use vgpu_broker::session::Session;
use vgpu_broker::tenant::SessionInfo;
use vgpu_proto::msg::{self, Request};
use vgpud::Daemon;

/// Bytes of the allocation the benchmarks' `Memset`s fill.
pub const BUFFER_BYTES: u64 = 4096;
/// Bytes one benchmark `Memset` fills.
pub const MEMSET_BYTES: u64 = 64;
/// The byte the benchmark `Memset`s write.
pub const MEMSET_VALUE: u32 = 7;

/// The benchmarks' `Memset` of the buffer at `ptr`.
pub fn memset(ctx: u64, ptr: u64) -> msg::Memset {
    msg::Memset {
        ctx,
        stream: 0,
        dst: ptr,
        value: MEMSET_VALUE,
        elem_size: 1,
        count: MEMSET_BYTES,
    }
}

/// A direct broker session with a context and a [`BUFFER_BYTES`] allocation.
pub struct Direct {
    session: Session,
    /// The session's context.
    pub ctx: u64,
    /// The allocation.
    pub ptr: u64,
    out: Vec<u8>,
}

impl Direct {
    /// Opens a session of VM `vm` of `daemon` and creates its context and allocation.
    pub fn open(daemon: &Daemon, vm: &str) -> Result<Direct, String> {
        let tenant = daemon
            .broker()
            .tenant(vm)
            .ok_or_else(|| format!("the benchmark VM {vm} is missing"))?;
        let info = Arc::new(SessionInfo::new(
            u64::MAX,
            0,
            "direct".into(),
            "in-process".into(),
        ));
        let session = Session::new(tenant, info).map_err(|e| format!("direct session: {e:?}"))?;
        let mut d = Direct {
            session,
            ctx: 0,
            ptr: 0,
            out: Vec::new(),
        };
        let create = Request::CtxCreate(msg::CtxCreate {
            device: 0,
            flags: 0,
        });
        d.call(&create, true)?;
        d.ctx = d.reply_u64()?;
        let alloc = Request::MemAlloc(msg::MemAlloc {
            ctx: d.ctx,
            size: BUFFER_BYTES,
        });
        d.call(&alloc, true)?;
        d.ptr = d.reply_u64()?;
        Ok(d)
    }

    /// Makes one call; its reply payload is kept for [`Direct::reply_u64`].
    fn call(&mut self, r: &Request, sync: bool) -> Result<(), String> {
        self.out.clear();
        self.session
            .handle(r, &[], &mut self.out, sync)
            .map_err(|e| format!("direct {}: {e:?}", r.name()))
    }

    fn reply_u64(&self) -> Result<u64, String> {
        self.out
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| "short reply from a direct call".to_string())
    }

    /// One posted call (its errors come back at the next synchronization).
    pub fn post(&mut self, r: &Request) -> Result<(), String> {
        self.call(r, false)
    }

    /// One `CtxSynchronize` of the context.
    #[inline(never)]
    pub fn synchronize(&mut self) -> Result<(), String> {
        let sync = Request::CtxSynchronize(msg::CtxSynchronize { ctx: self.ctx });
        self.call(&sync, true)
    }

    /// `n` posted [`memset`]s, then the `CtxSynchronize` that closes them.
    #[inline(never)]
    pub fn posted_memsets(&mut self, n: usize) -> Result<(), String> {
        let m = Request::Memset(memset(self.ctx, self.ptr));
        for _ in 0..n {
            self.call(&m, false)?;
        }
        self.synchronize()
    }
}
