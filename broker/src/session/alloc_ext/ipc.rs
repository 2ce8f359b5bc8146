//! Legacy interprocess memory (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle`,
//! `cuIpcCloseMemHandle`) between processes of one VM.
//!
//! An export is a random 128-bit token naming one `cuMemAlloc` allocation; only sessions of
//! the same VM can open it (the VM's sessions share one device context, so the memory is
//! opened at the address the exporter has). Tokens of another VM are refused: memory is
//! never shared between VMs.
//!
//! The rule for freeing: the exporter's `cuMemFree` (or its exit) ends its own use and the
//! token (no new opening), but the memory stays allocated, and charged once to the VM, until
//! the last process that opened it closes it (or exits). Nothing is ever freed on the device
//! while a process of the VM can still reach it. Exports and openings are handles, counted
//! against the VM's `handles` budget.

pub(in crate::session) mod event;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use vgpu_proto::cuda;
use vgpu_proto::msg::{self, Request};

use super::super::{Session, release_allocation, reply};
use super::tokens::TokenTable;
use crate::device::DeviceContext;
use crate::error::CuError;
use crate::handles::{HandleKind, HandleTable};
use crate::memory::{AllocKind, Allocation};
use crate::tenant::Tenant;

/// One exported allocation, shared by its exporter and the sessions that opened it.
pub(in crate::session) struct IpcMem {
    token: u128,
    base: u64,
    size: u64,
    /// The exporting session.
    owner: u64,
    tenant: Arc<Tenant>,
    dev: Arc<dyn DeviceContext>,
    /// The exporter's allocation, once the exporter let go of it: released when the last
    /// opening closes.
    orphan: Mutex<Option<Allocation>>,
}

impl std::fmt::Debug for IpcMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcMem")
            .field("base", &self.base)
            .field("size", &self.size)
            .field("owner", &self.owner)
            .finish()
    }
}

impl Drop for IpcMem {
    fn drop(&mut self) {
        EXPORTS.forget(self.token);
        let orphan = self.orphan.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = orphan.take() {
            release_allocation(&self.tenant, self.dev.as_ref(), self.base, &a);
        }
    }
}

/// Exported allocations of every VM by token (each checked against the VM that opens it).
static EXPORTS: TokenTable<Weak<IpcMem>> = TokenTable::new();

/// A session's exports and openings.
#[derive(Debug)]
pub(in crate::session) struct IpcState {
    /// Allocations this session exported, by handle.
    exported: HandleTable<Arc<IpcMem>>,
    /// Base address → handle in `exported`.
    exported_at: BTreeMap<u64, u64>,
    /// Memory this session opened (and how many times), by handle.
    opened: HandleTable<(Arc<IpcMem>, u32)>,
    /// Base address → handle in `opened`.
    opened_at: BTreeMap<u64, u64>,
    /// Events this session exported or opened (their budget handles).
    events: HandleTable<()>,
}

impl Default for IpcState {
    fn default() -> Self {
        Self {
            exported: HandleTable::new(HandleKind::IpcMem),
            exported_at: BTreeMap::new(),
            opened: HandleTable::new(HandleKind::IpcMem),
            opened_at: BTreeMap::new(),
            events: HandleTable::new(HandleKind::IpcEvent),
        }
    }
}

impl IpcState {
    /// Counts exports and openings against `budget`.
    pub(in crate::session) fn set_budget(&mut self, budget: crate::limits::HandleBudget) {
        self.exported.set_budget(budget.clone());
        self.opened.set_budget(budget.clone());
        self.events.set_budget(budget);
    }
}

fn split(t: u128) -> msg::Token {
    msg::Token {
        hi: (t >> 64) as u64,
        lo: t as u64,
    }
}

impl Session {
    /// The interprocess memory requests; `None` for other requests.
    pub(in crate::session) fn dispatch_ipc(
        &mut self,
        req: &Request,
        out: &mut Vec<u8>,
    ) -> Option<Result<(), CuError>> {
        use Request as R;
        Some(match req {
            R::IpcGetMemHandle(m) => self
                .ipc_export(m.ctx, m.ptr)
                .and_then(|t| reply(out, split(t))),
            R::IpcOpenMemHandle(m) => self
                .ipc_open(m.ctx, (u128::from(m.hi) << 64) | u128::from(m.lo))
                .and_then(|(base, size)| reply(out, msg::Range { base, size })),
            R::IpcCloseMemHandle(m) => self
                .ipc_close(m.ctx, m.ptr)
                .and_then(|()| reply(out, msg::Empty {})),
            R::IpcGetEventHandle(m) => self
                .ipc_event_export(m.ctx, m.event)
                .and_then(|t| reply(out, split(t))),
            R::IpcOpenEventHandle(m) => self
                .ipc_event_open(m.ctx, (u128::from(m.hi) << 64) | u128::from(m.lo))
                .and_then(|handle| reply(out, msg::Handle { handle })),
            _ => return None,
        })
    }

    fn ipc_export(&mut self, ctx: u64, ptr: u64) -> Result<u128, CuError> {
        self.ctx(ctx)?;
        let (base, a) = match self.allocs.find(ptr) {
            Some((base, a)) if a.kind == AllocKind::Device => (base, *a),
            Some(_) => {
                return Err(CuError::invalid_value(format!(
                    "{ptr:#x} is not memory from cuMemAlloc: only cuMemAlloc allocations can be exported with cuIpcGetMemHandle"
                )));
            }
            None => {
                return Err(CuError::invalid_value(format!(
                    "{ptr:#x} is not inside a live allocation of this process"
                )));
            }
        };
        if let Some(h) = self.ext.ipc.exported_at.get(&base)
            && let Some(m) = self.ext.ipc.exported.get(*h)
        {
            return Ok(m.token);
        }
        let token = EXPORTS.fresh();
        let mem = Arc::new(IpcMem {
            token,
            base,
            size: a.size,
            owner: self.info.id,
            tenant: Arc::clone(&self.tenant),
            dev: Arc::clone(&self.dev),
            orphan: Mutex::new(None),
        });
        // Budget first: a refused export leaves no token behind.
        let weak = Arc::downgrade(&mem);
        let h = self.ext.ipc.exported.insert(mem)?;
        self.ext.ipc.exported_at.insert(base, h);
        EXPORTS.lock().insert(token, weak);
        Ok(token)
    }

    fn ipc_open(&mut self, ctx: u64, token: u128) -> Result<(u64, u64), CuError> {
        self.ctx(ctx)?;
        let found = EXPORTS.lock().get(&token).and_then(Weak::upgrade);
        let Some(mem) = found else {
            return Err(CuError::invalid_handle(
                "no memory of this VM was exported under this IPC handle (or its exporter freed it)",
            ));
        };
        self.check_ipc_opener(&mem.tenant, mem.owner, "memory")?;
        let (base, size) = (mem.base, mem.size);
        if let Some(&h) = self.ext.ipc.opened_at.get(&base)
            && let Some(e) = self.ext.ipc.opened.get_mut(h)
        {
            e.1 = e.1.saturating_add(1);
            return Ok((base, size));
        }
        let h = self.ext.ipc.opened.insert((mem, 1))?;
        self.ext.ipc.opened_at.insert(base, h);
        self.allocs.insert(
            base,
            Allocation {
                size,
                charged: 0,
                ctx,
                kind: AllocKind::IpcImport,
            },
        );
        Ok((base, size))
    }

    /// Whether this session may open an IPC export of `tenant` made by session `owner`: only
    /// another process of the same VM may (`what`: "memory", "events").
    pub(in crate::session) fn check_ipc_opener(
        &self,
        tenant: &Arc<Tenant>,
        owner: u64,
        what: &str,
    ) -> Result<(), CuError> {
        if !Arc::ptr_eq(tenant, &self.tenant) {
            tracing::warn!(
                tenant = %self.tenant.name,
                session = self.info.id,
                what,
                "refused an IPC handle of another VM"
            );
            return Err(CuError::invalid_handle(format!(
                "this IPC handle was exported by another VM: {what} are never shared between VMs"
            )));
        }
        if owner == self.info.id {
            return Err(CuError::new(
                cuda::CUDA_ERROR_INVALID_CONTEXT,
                format!("an IPC handle of {what} cannot be opened in the process that exported it"),
            ));
        }
        Ok(())
    }

    fn ipc_close(&mut self, ctx: u64, ptr: u64) -> Result<(), CuError> {
        self.ctx(ctx)?;
        let Some(&h) = self.ext.ipc.opened_at.get(&ptr) else {
            return Err(CuError::invalid_value(format!(
                "{ptr:#x} is not memory this process opened with cuIpcOpenMemHandle (or it was closed)"
            )));
        };
        let last = match self.ext.ipc.opened.get_mut(h) {
            Some(e) => {
                e.1 -= 1;
                e.1 == 0
            }
            None => true,
        };
        if last {
            // Queued work of this process may still use the memory.
            self.engine.drain()?;
            self.ipc_drop_opened(ptr);
        }
        Ok(())
    }

    /// Ends this session's opening of the memory at `base` (every count).
    fn ipc_drop_opened(&mut self, base: u64) {
        if let Some(h) = self.ext.ipc.opened_at.remove(&base) {
            self.ext.ipc.opened.remove(h);
            self.allocs.remove(base);
        }
    }

    /// `free_allocation`'s part for shared memory: an opening is closed; an exported
    /// allocation leaves this session and its token goes, but the memory is released only
    /// when no other process has it open. `false` for memory that is not shared.
    pub(in crate::session) fn ipc_free(&mut self, base: u64) -> bool {
        if self.ext.ipc.opened_at.contains_key(&base) {
            self.ipc_drop_opened(base);
            return true;
        }
        let Some(h) = self.ext.ipc.exported_at.remove(&base) else {
            return false;
        };
        let Some(mem) = self.ext.ipc.exported.remove(h) else {
            return false;
        };
        EXPORTS.forget(mem.token);
        if let Some(a) = self.allocs.remove(base) {
            *mem.orphan.lock().unwrap_or_else(|p| p.into_inner()) = Some(a);
        }
        // The last reference releases the memory (now, if nobody has it open).
        drop(mem);
        self.store_memory();
        true
    }

    /// Ends every export and opening (the session ended; its work was discarded).
    pub(in crate::session) fn release_ipc(&mut self) {
        for base in self.ext.ipc.opened_at.keys().copied().collect::<Vec<_>>() {
            self.ipc_drop_opened(base);
        }
        for base in self.ext.ipc.exported_at.keys().copied().collect::<Vec<_>>() {
            self.ipc_free(base);
        }
        self.store_memory();
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use vgpu_proto::cuda;
    use vgpu_proto::msg;

    use crate::testutils::{MemDevice, TestClient, vm};

    type Client = TestClient<UnixStream>;

    /// A broker on the in-memory device with VMs `vm1` (handles budget `handles`) and `vm2`.
    fn broker(handles: u32) -> std::sync::Arc<crate::Broker> {
        let dev: std::sync::Arc<dyn crate::device::Device> =
            std::sync::Arc::new(MemDevice::new(1 << 30, std::time::Duration::ZERO));
        let b = std::sync::Arc::new(crate::Broker::new(vec![("gpu0".into(), dev)]));
        let mut v1 = vm("vm1", 64 << 20);
        v1.limits.handles = handles;
        b.add_tenant(&v1).unwrap();
        b.add_tenant(&vm("vm2", 64 << 20)).unwrap();
        b
    }

    /// A session (a process) of `tenant`, with a context.
    fn session(b: &std::sync::Arc<crate::Broker>, tenant: &str) -> (Client, u64) {
        crate::testutils::serve_session(b, tenant)
    }

    fn alloc(c: &mut Client, ctx: u64, size: u64) -> u64 {
        c.call(&msg::MemAlloc { ctx, size }, &[]).unwrap().0.ptr
    }

    fn export(c: &mut Client, ctx: u64, ptr: u64) -> Result<msg::Token, cuda::CuResult> {
        c.call(&msg::IpcGetMemHandle { ctx, ptr }, &[])
            .map(|r| r.0)
            .map_err(|e| e.0)
    }

    fn open(c: &mut Client, ctx: u64, t: &msg::Token) -> Result<msg::Range, cuda::CuResult> {
        c.call(
            &msg::IpcOpenMemHandle {
                ctx,
                hi: t.hi,
                lo: t.lo,
            },
            &[],
        )
        .map(|r| r.0)
        .map_err(|e| e.0)
    }

    fn close(c: &mut Client, ctx: u64, ptr: u64) -> Result<(), cuda::CuResult> {
        c.call(&msg::IpcCloseMemHandle { ctx, ptr }, &[])
            .map(drop)
            .map_err(|e| e.0)
    }

    #[test]
    fn forged_foreign_and_own_tokens_are_refused() {
        let b = broker(1024);
        let (mut a, actx) = session(&b, "vm1");
        let (mut other, octx) = session(&b, "vm1");
        let (mut foreign, fctx) = session(&b, "vm2");
        let p = alloc(&mut a, actx, 4096);
        let t = export(&mut a, actx, p).unwrap();
        assert_ne!((t.hi, t.lo), (0, 0));
        assert_ne!(t.hi ^ t.lo, p, "the token is not the address");
        // Another VM: refused, as are forged tokens (one bit off, zero).
        assert_eq!(
            open(&mut foreign, fctx, &t),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        let forged = msg::Token {
            hi: t.hi,
            lo: t.lo ^ 1,
        };
        assert_eq!(
            open(&mut other, octx, &forged),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        let zero = msg::Token { hi: 0, lo: 0 };
        assert_eq!(
            open(&mut other, octx, &zero),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        // The exporting process itself: CUDA's answer.
        assert_eq!(
            open(&mut a, actx, &t),
            Err(cuda::CUDA_ERROR_INVALID_CONTEXT)
        );
        // A bad context is refused before the token is looked at.
        assert!(open(&mut other, 0xdead, &t).is_err());
        // The same VM opens it at the exporter's address; a double close is refused.
        let r = open(&mut other, octx, &t).unwrap();
        assert_eq!((r.base, r.size), (p, 4096));
        close(&mut other, octx, p).unwrap();
        assert_eq!(
            close(&mut other, octx, p),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        // Closing what was never opened, or the exporter's own memory, is refused.
        assert_eq!(close(&mut a, actx, p), Err(cuda::CUDA_ERROR_INVALID_VALUE));
        // Only cuMemAlloc memory is exported.
        assert_eq!(
            export(&mut a, actx, p + 4096 * 1024),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn memory_is_charged_once_and_outlives_the_exporters_free() {
        let b = broker(1024);
        let t1 = b.tenant("vm1").unwrap();
        let (mut a, actx) = session(&b, "vm1");
        let (mut other, octx) = session(&b, "vm1");
        let p = alloc(&mut a, actx, 1 << 20);
        let used = t1.slice.used();
        assert!(used >= 1 << 20);
        let t = export(&mut a, actx, p).unwrap();
        open(&mut other, octx, &t).unwrap();
        open(&mut other, octx, &t).unwrap();
        assert_eq!(t1.slice.used(), used, "opening charges nothing more");
        c_free(&mut a, actx, p);
        assert_eq!(t1.slice.used(), used, "still open elsewhere");
        // The freed allocation's token opens no more.
        let (mut late, lctx) = session(&b, "vm1");
        assert_eq!(
            open(&mut late, lctx, &t),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        // The importer still reaches it; the last of its two openings gives it back.
        other
            .call(
                &msg::Memset {
                    ctx: octx,
                    stream: 0,
                    dst: p,
                    value: 7,
                    elem_size: 1,
                    count: 16,
                },
                &[],
            )
            .unwrap();
        close(&mut other, octx, p).unwrap();
        assert_eq!(t1.slice.used(), used);
        close(&mut other, octx, p).unwrap();
        assert_eq!(t1.slice.used(), 0);
    }

    fn c_free(c: &mut Client, ctx: u64, ptr: u64) {
        c.call(&msg::MemFree { ctx, ptr }, &[]).unwrap();
    }

    #[test]
    fn exports_and_openings_count_against_the_handles_budget() {
        let b = broker(8);
        let (mut a, actx) = session(&b, "vm1");
        let mut refused = None;
        for i in 0..64 {
            let p = alloc(&mut a, actx, 4096);
            if let Err(e) = export(&mut a, actx, p) {
                refused = Some((i, e));
                break;
            }
        }
        let (i, e) = refused.expect("exports are bounded");
        assert!(i < 8, "{i} exports");
        assert_eq!(e, cuda::CUDA_ERROR_OUT_OF_MEMORY);
    }

    #[test]
    fn a_session_that_ends_releases_what_it_exported_and_opened() {
        let b = broker(1024);
        let t1 = b.tenant("vm1").unwrap();
        let (mut a, actx) = session(&b, "vm1");
        let p = alloc(&mut a, actx, 4096);
        let t = export(&mut a, actx, p).unwrap();
        {
            let (mut other, octx) = session(&b, "vm1");
            open(&mut other, octx, &t).unwrap();
            drop(a);
            // The exporter's end leaves the memory to the importer.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let (mut late, lctx) = session(&b, "vm1");
            while open(&mut late, lctx, &t) != Err(cuda::CUDA_ERROR_INVALID_HANDLE) {
                assert!(std::time::Instant::now() < deadline);
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!(t1.slice.used() > 0);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while t1.slice.used() != 0 {
            assert!(std::time::Instant::now() < deadline, "memory leaked");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    const IPC_EVENT: u32 =
        super::super::super::EVENT_INTERPROCESS | super::super::super::EVENT_DISABLE_TIMING;

    fn event(c: &mut Client, ctx: u64, flags: u32) -> u64 {
        c.call(&msg::EventCreate { ctx, flags }, &[])
            .unwrap()
            .0
            .handle
    }

    fn export_event(c: &mut Client, ctx: u64, event: u64) -> Result<msg::Token, cuda::CuResult> {
        c.call(&msg::IpcGetEventHandle { ctx, event }, &[])
            .map(|r| r.0)
            .map_err(|e| e.0)
    }

    fn open_event(c: &mut Client, ctx: u64, t: &msg::Token) -> Result<u64, cuda::CuResult> {
        c.call(
            &msg::IpcOpenEventHandle {
                ctx,
                hi: t.hi,
                lo: t.lo,
            },
            &[],
        )
        .map(|r| r.0.handle)
        .map_err(|e| e.0)
    }

    /// Holds the exporter's default stream at a host function gate, then records `ev` behind it.
    fn held_record(c: &mut Client, ctx: u64, ev: u64, gate: u64) {
        c.call(
            &msg::StreamHostFunc {
                ctx,
                stream: 0,
                token_hi: 7,
                token_lo: gate,
            },
            &[],
        )
        .unwrap();
        // Posted: a call of asynchronous work also waits for it.
        c.post(
            &msg::EventRecord {
                ctx,
                stream: 0,
                event: ev,
            },
            &[],
        )
        .unwrap();
        // Answered in order: the record is submitted, and held.
        assert_eq!(
            status(c, &msg::EventQuery { ctx, event: ev }),
            Err(cuda::CUDA_ERROR_NOT_READY)
        );
    }

    fn status<O: vgpu_proto::msg::Op>(c: &mut Client, req: &O) -> Result<(), cuda::CuResult> {
        c.call(req, &[]).map(drop).map_err(|e| e.0)
    }

    #[test]
    fn ipc_event_tokens_are_checked() {
        let b = broker(1024);
        let (mut a, actx) = session(&b, "vm1");
        let (mut other, octx) = session(&b, "vm1");
        let (mut foreign, fctx) = session(&b, "vm2");
        let plain = event(&mut a, actx, super::super::super::EVENT_DISABLE_TIMING);
        assert_eq!(
            export_event(&mut a, actx, plain),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE),
            "an event without CU_EVENT_INTERPROCESS"
        );
        let ev = event(&mut a, actx, IPC_EVENT);
        let t = export_event(&mut a, actx, ev).unwrap();
        assert_ne!((t.hi, t.lo), (0, 0));
        assert_eq!(
            export_event(&mut a, actx, ev).unwrap(),
            t,
            "one token per event"
        );
        assert_eq!(
            open_event(&mut foreign, fctx, &t),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        let forged = msg::Token {
            hi: t.hi ^ 1,
            lo: t.lo,
        };
        assert_eq!(
            open_event(&mut other, octx, &forged),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        assert_eq!(
            open_event(&mut a, actx, &t),
            Err(cuda::CUDA_ERROR_INVALID_CONTEXT)
        );
        let opened = open_event(&mut other, octx, &t).unwrap();
        assert_eq!(
            export_event(&mut other, octx, opened),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE),
            "an opened event is not exported again"
        );
        // A memory token is not an event token.
        let p = alloc(&mut a, actx, 4096);
        let mt = export(&mut a, actx, p).unwrap();
        assert_eq!(
            open_event(&mut other, octx, &mt),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        // The exporter's destroy ends new openings.
        status(
            &mut a,
            &msg::EventDestroy {
                ctx: actx,
                event: ev,
            },
        )
        .unwrap();
        assert_eq!(
            open_event(&mut other, octx, &t),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
    }

    #[test]
    fn an_opened_event_orders_the_importers_stream_after_the_exporters_record() {
        let b = broker(1024);
        let (mut a, actx) = session(&b, "vm1");
        let (mut other, octx) = session(&b, "vm1");
        let ev = event(&mut a, actx, IPC_EVENT);
        let t = export_event(&mut a, actx, ev).unwrap();
        let opened = open_event(&mut other, octx, &t).unwrap();
        // Never recorded: done.
        status(
            &mut other,
            &msg::EventQuery {
                ctx: octx,
                event: opened,
            },
        )
        .unwrap();
        held_record(&mut a, actx, ev, 1);
        assert_eq!(
            status(
                &mut other,
                &msg::EventQuery {
                    ctx: octx,
                    event: opened
                }
            ),
            Err(cuda::CUDA_ERROR_NOT_READY)
        );
        let p = alloc(&mut other, octx, 4096);
        other
            .post(
                &msg::StreamWaitEvent {
                    ctx: octx,
                    stream: 0,
                    event: opened,
                    flags: 0,
                },
                &[],
            )
            .unwrap();
        other
            .post(
                &msg::Memset {
                    ctx: octx,
                    stream: 0,
                    dst: p,
                    value: 9,
                    elem_size: 1,
                    count: 16,
                },
                &[],
            )
            .unwrap();
        // The importer's stream is held by the exporter's pending record.
        assert_eq!(
            status(
                &mut other,
                &msg::StreamQuery {
                    ctx: octx,
                    stream: 0
                }
            ),
            Err(cuda::CUDA_ERROR_NOT_READY)
        );
        // The exporter's host function runs: its record, then the importer's memset, run.
        status(
            &mut a,
            &msg::HostFuncDone {
                token_hi: 7,
                token_lo: 1,
            },
        )
        .unwrap();
        status(
            &mut other,
            &msg::EventSynchronize {
                ctx: octx,
                event: opened,
            },
        )
        .unwrap();
        status(
            &mut other,
            &msg::EventQuery {
                ctx: octx,
                event: opened,
            },
        )
        .unwrap();
        status(
            &mut other,
            &msg::StreamSynchronize {
                ctx: octx,
                stream: 0,
            },
        )
        .unwrap();
    }

    #[test]
    fn the_exporters_end_ends_the_importers_wait_with_an_error() {
        let b = broker(1024);
        let (mut a, actx) = session(&b, "vm1");
        let (mut other, octx) = session(&b, "vm1");
        let ev = event(&mut a, actx, IPC_EVENT);
        let t = export_event(&mut a, actx, ev).unwrap();
        let opened = open_event(&mut other, octx, &t).unwrap();
        held_record(&mut a, actx, ev, 2);
        other
            .post(
                &msg::StreamWaitEvent {
                    ctx: octx,
                    stream: 0,
                    event: opened,
                    flags: 0,
                },
                &[],
            )
            .unwrap();
        // The exporter goes with its record pending: the wait fails, it does not hang.
        drop(a);
        assert_eq!(
            status(
                &mut other,
                &msg::StreamSynchronize {
                    ctx: octx,
                    stream: 0
                }
            ),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        assert_eq!(
            status(
                &mut other,
                &msg::EventSynchronize {
                    ctx: octx,
                    event: opened
                }
            ),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        assert_eq!(
            status(
                &mut other,
                &msg::EventQuery {
                    ctx: octx,
                    event: opened
                }
            ),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        // The context is not poisoned: later work runs.
        status(&mut other, &msg::CtxSynchronize { ctx: octx }).unwrap();
        status(
            &mut other,
            &msg::EventDestroy {
                ctx: octx,
                event: opened,
            },
        )
        .unwrap();
    }

    #[test]
    fn event_exports_and_openings_count_against_the_handles_budget() {
        let b = broker(8);
        let (mut a, actx) = session(&b, "vm1");
        let mut refused = None;
        for i in 0..64 {
            let ev = event(&mut a, actx, IPC_EVENT);
            if let Err(e) = export_event(&mut a, actx, ev) {
                refused = Some((i, e));
                break;
            }
        }
        let (i, e) = refused.expect("event exports are bounded");
        assert!(i < 8, "{i} exports");
        assert_eq!(e, cuda::CUDA_ERROR_OUT_OF_MEMORY);
    }

    #[test]
    fn event_handles_return_to_the_budget() {
        use vgpu_config::limits::Budget;
        let b = broker(1024);
        let t1 = b.tenant("vm1").unwrap();
        let (mut a, actx) = session(&b, "vm1");
        let (mut other, octx) = session(&b, "vm1");
        let ev = event(&mut a, actx, IPC_EVENT);
        let base = t1.limits.used(Budget::Handles);
        let t = export_event(&mut a, actx, ev).unwrap();
        let opened = open_event(&mut other, octx, &t).unwrap();
        assert_eq!(t1.limits.used(Budget::Handles), base + 2);
        status(
            &mut other,
            &msg::EventDestroy {
                ctx: octx,
                event: opened,
            },
        )
        .unwrap();
        assert_eq!(t1.limits.used(Budget::Handles), base + 1);
        // An export ends with its session (and so does the session's context).
        drop(a);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while t1.limits.used(Budget::Handles) + 1 != base {
            assert!(std::time::Instant::now() < deadline, "handles leaked");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Posts a wait for `ev` on stream 0, then a memset behind it; returns the memory.
    fn wait_then_memset(c: &mut Client, ctx: u64, ev: u64) {
        c.post(
            &msg::StreamWaitEvent {
                ctx,
                stream: 0,
                event: ev,
                flags: 0,
            },
            &[],
        )
        .unwrap();
        let p = alloc(c, ctx, 4096);
        c.post(
            &msg::Memset {
                ctx,
                stream: 0,
                dst: p,
                value: 5,
                elem_size: 1,
                count: 64,
            },
            &[],
        )
        .unwrap();
    }

    fn query(c: &mut Client, ctx: u64, event: u64) -> Result<(), cuda::CuResult> {
        status(c, &msg::EventQuery { ctx, event })
    }

    fn stream_query(c: &mut Client, ctx: u64) -> Result<(), cuda::CuResult> {
        status(c, &msg::StreamQuery { ctx, stream: 0 })
    }

    fn release(c: &mut Client, gate: u64) {
        status(
            c,
            &msg::HostFuncDone {
                token_hi: 7,
                token_lo: gate,
            },
        )
        .unwrap();
    }

    #[test]
    fn any_holder_records_the_shared_event_and_waits_follow_the_latest_record_then() {
        let b = broker(1024);
        let (mut a, actx) = session(&b, "vm1");
        let (mut x, xctx) = session(&b, "vm1");
        let (mut y, yctx) = session(&b, "vm1");
        let ev = event(&mut a, actx, IPC_EVENT);
        let t = export_event(&mut a, actx, ev).unwrap();
        let xe = open_event(&mut x, xctx, &t).unwrap();
        let ye = open_event(&mut y, yctx, &t).unwrap();
        // The importer x records the event, behind a host function of its own.
        held_record(&mut x, xctx, xe, 10);
        // The exporter and the other importer follow x's record.
        assert_eq!(query(&mut a, actx, ev), Err(cuda::CUDA_ERROR_NOT_READY));
        assert_eq!(query(&mut y, yctx, ye), Err(cuda::CUDA_ERROR_NOT_READY));
        // The exporter's stream waits for x's record (the latest at the time of the wait).
        wait_then_memset(&mut a, actx, ev);
        assert_eq!(stream_query(&mut a, actx), Err(cuda::CUDA_ERROR_NOT_READY));
        // y records it too, and its record runs at once: now the latest, and done, for all.
        status(
            &mut y,
            &msg::EventRecord {
                ctx: yctx,
                stream: 0,
                event: ye,
            },
        )
        .unwrap();
        query(&mut y, yctx, ye).unwrap();
        query(&mut a, actx, ev).unwrap();
        query(&mut x, xctx, xe).unwrap();
        status(
            &mut a,
            &msg::EventSynchronize {
                ctx: actx,
                event: ev,
            },
        )
        .unwrap();
        // The exporter's earlier wait still follows the record it captured: x's, held.
        assert_eq!(stream_query(&mut a, actx), Err(cuda::CUDA_ERROR_NOT_READY));
        // x's host function runs: its record, then the exporter's memset.
        release(&mut x, 10);
        status(
            &mut a,
            &msg::StreamSynchronize {
                ctx: actx,
                stream: 0,
            },
        )
        .unwrap();
        // The exporter records again: its record is the latest for the importers.
        held_record(&mut a, actx, ev, 11);
        assert_eq!(query(&mut x, xctx, xe), Err(cuda::CUDA_ERROR_NOT_READY));
        wait_then_memset(&mut y, yctx, ye);
        assert_eq!(stream_query(&mut y, yctx), Err(cuda::CUDA_ERROR_NOT_READY));
        release(&mut a, 11);
        status(
            &mut y,
            &msg::StreamSynchronize {
                ctx: yctx,
                stream: 0,
            },
        )
        .unwrap();
        query(&mut x, xctx, xe).unwrap();
    }

    #[test]
    fn an_importer_that_ends_with_its_record_pending_fails_the_waits_for_it() {
        let b = broker(1024);
        let (mut a, actx) = session(&b, "vm1");
        let (mut x, xctx) = session(&b, "vm1");
        let (mut y, yctx) = session(&b, "vm1");
        let ev = event(&mut a, actx, IPC_EVENT);
        let t = export_event(&mut a, actx, ev).unwrap();
        let xe = open_event(&mut x, xctx, &t).unwrap();
        let ye = open_event(&mut y, yctx, &t).unwrap();
        held_record(&mut x, xctx, xe, 20);
        wait_then_memset(&mut a, actx, ev);
        // x goes with its record pending: it never runs, and nothing hangs for it.
        drop(x);
        assert_eq!(
            status(
                &mut a,
                &msg::StreamSynchronize {
                    ctx: actx,
                    stream: 0
                }
            ),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        assert_eq!(
            query(&mut a, actx, ev),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        assert_eq!(
            status(
                &mut y,
                &msg::EventSynchronize {
                    ctx: yctx,
                    event: ye
                }
            ),
            Err(cuda::CUDA_ERROR_INVALID_HANDLE)
        );
        // The error is not sticky: a new record (here y's) makes the event usable again.
        status(
            &mut y,
            &msg::EventRecord {
                ctx: yctx,
                stream: 0,
                event: ye,
            },
        )
        .unwrap();
        query(&mut a, actx, ev).unwrap();
        wait_then_memset(&mut a, actx, ev);
        status(
            &mut a,
            &msg::StreamSynchronize {
                ctx: actx,
                stream: 0,
            },
        )
        .unwrap();
    }

    /// Instantiates a graph of `nodes` (each after the one before) in `c`.
    fn graph(c: &mut Client, ctx: u64, nodes: &[u8]) -> u64 {
        c.call(&msg::GraphInstantiate { ctx, replace: 0 }, nodes)
            .unwrap()
            .0
            .handle
    }

    #[test]
    fn graph_event_nodes_on_an_opened_event_wait_for_and_record_the_shared_event() {
        use vgpu_proto::graph::push_op;
        let b = broker(1024);
        let (mut a, actx) = session(&b, "vm1");
        let (mut x, xctx) = session(&b, "vm1");
        let ev = event(&mut a, actx, IPC_EVENT);
        let t = export_event(&mut a, actx, ev).unwrap();
        let xe = open_event(&mut x, xctx, &t).unwrap();
        let p = alloc(&mut x, xctx, 4096);
        // A graph that waits for the event, then fills memory.
        let mut nodes = Vec::new();
        push_op(
            &mut nodes,
            &msg::StreamWaitEvent {
                ctx: xctx,
                stream: 0,
                event: xe,
                flags: 0,
            },
            &[],
        );
        push_op(
            &mut nodes,
            &msg::Memset {
                ctx: xctx,
                stream: 0,
                dst: p,
                value: 1,
                elem_size: 1,
                count: 16,
            },
            &[],
        );
        let waits = graph(&mut x, xctx, &nodes);
        held_record(&mut a, actx, ev, 30);
        x.post(
            &msg::GraphLaunch {
                ctx: xctx,
                stream: 0,
                exec: waits,
            },
            &[],
        )
        .unwrap();
        // The launched graph is held at the exporter's record.
        assert_eq!(stream_query(&mut x, xctx), Err(cuda::CUDA_ERROR_NOT_READY));
        release(&mut a, 30);
        status(
            &mut x,
            &msg::StreamSynchronize {
                ctx: xctx,
                stream: 0,
            },
        )
        .unwrap();
        // A graph that records the opened event: the exporter follows its record.
        let mut nodes = Vec::new();
        push_op(
            &mut nodes,
            &msg::EventRecord {
                ctx: xctx,
                stream: 0,
                event: xe,
            },
            &[],
        );
        let records = graph(&mut x, xctx, &nodes);
        status(
            &mut x,
            &msg::StreamHostFunc {
                ctx: xctx,
                stream: 0,
                token_hi: 7,
                token_lo: 31,
            },
        )
        .unwrap();
        x.post(
            &msg::GraphLaunch {
                ctx: xctx,
                stream: 0,
                exec: records,
            },
            &[],
        )
        .unwrap();
        assert_eq!(query(&mut x, xctx, xe), Err(cuda::CUDA_ERROR_NOT_READY));
        assert_eq!(query(&mut a, actx, ev), Err(cuda::CUDA_ERROR_NOT_READY));
        wait_then_memset(&mut a, actx, ev);
        assert_eq!(stream_query(&mut a, actx), Err(cuda::CUDA_ERROR_NOT_READY));
        release(&mut x, 31);
        status(
            &mut a,
            &msg::StreamSynchronize {
                ctx: actx,
                stream: 0,
            },
        )
        .unwrap();
        query(&mut a, actx, ev).unwrap();
    }
}
