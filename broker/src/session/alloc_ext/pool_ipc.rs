//! Stream-ordered memory pools shared between processes of one VM
//! (`cuMemPoolExportToShareableHandle`, `cuMemPoolImportFromShareableHandle`,
//! `cuMemPoolExportPointer`, `cuMemPoolImportPointer`).
//!
//! A pool export is a random 128-bit token naming a pool created with export handle types; a
//! pointer export is a second token naming one block of it. Only sessions of the same VM can
//! import them (the VM's sessions share one device context, so a block is opened at the
//! exporter's address). An imported pool allocates nothing (CUDA's imported pools cannot);
//! it is what `cuMemPoolImportPointer` opens blocks through. Tokens of another VM are refused:
//! memory is never shared between VMs.
//!
//! Freeing: when the exporter frees a block that another process still has open, the block
//! does not go back to its pool (a later `cuMemAllocAsync` would hand it out again). It
//! leaves the pool as an orphan, kept allocated and charged once to the VM until the last
//! process that opened it frees it (or exits). The exporter's `cuMemPoolDestroy` or exit ends
//! the pool's tokens but leaves opened blocks to their importers. Exports, imported pools and
//! opened blocks are handles counted against the VM's `handles` budget.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use vgpu_proto::cuda;
use vgpu_proto::msg::{self, Request};

use super::super::{Session, reply};
use super::PoolState;
use super::tokens::TokenTable;
use crate::device::DeviceContext;
use crate::error::CuError;
use crate::handles::{HandleKind, HandleTable};
use crate::memory::{AllocKind, Allocation};
use crate::tenant::Tenant;
use crate::usage::UsageKind;

/// An exported pool, shared by its exporter and the pools imported from it.
pub(in crate::session) struct SharedPool {
    token: u128,
    /// The exporting session.
    owner: u64,
    tenant: Arc<Tenant>,
}

impl std::fmt::Debug for SharedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPool")
            .field("owner", &self.owner)
            .finish()
    }
}

impl Drop for SharedPool {
    fn drop(&mut self) {
        TOKENS.forget(self.token);
    }
}

/// One exported block, shared by its exporter (while the block is in use in its pool) and the
/// sessions that opened it.
pub(in crate::session) struct SharedBlock {
    token: u128,
    /// The token of the pool the block belongs to.
    pool: u128,
    base: u64,
    size: u64,
    /// Bytes charged to the slice for the block.
    charged: u64,
    owner: u64,
    tenant: Arc<Tenant>,
    dev: Arc<dyn DeviceContext>,
    /// The block left its pool (its exporter freed it or ended while others had it open):
    /// the last reference frees it and gives its charge back.
    orphan: Mutex<bool>,
}

impl std::fmt::Debug for SharedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBlock")
            .field("base", &self.base)
            .field("size", &self.size)
            .field("owner", &self.owner)
            .finish()
    }
}

impl Drop for SharedBlock {
    fn drop(&mut self) {
        TOKENS.forget(self.token);
        if *self.orphan.get_mut().unwrap_or_else(|p| p.into_inner()) {
            if let Err(e) = self.dev.free(self.base) {
                tracing::warn!(tenant = %self.tenant.name, error = %e, "device refused to free shared pool block {:#x}", self.base);
            }
            self.tenant.slice.refund(self.charged);
            self.tenant.usage.sub(UsageKind::PoolReserved, self.charged);
        }
    }
}

/// What a token names.
#[derive(Clone)]
enum Shared {
    Pool(Weak<SharedPool>),
    Block(Weak<SharedBlock>),
}

/// Exported pools and blocks of every VM by token (each checked against the VM that imports).
static TOKENS: TokenTable<Shared> = TokenTable::new();

/// A pool's export: the shared part and its handle in the session's budget table.
pub(super) type PoolShare = (Arc<SharedPool>, u64);
/// A block's export: the shared part and its handle in the session's budget table.
pub(super) type BlockShare = (Arc<SharedBlock>, u64);

/// A session's pool exports and opened blocks.
#[derive(Debug)]
pub(in crate::session) struct PoolIpcState {
    /// One entry per pool or block this session exported (the budget's count).
    exports: HandleTable<()>,
    /// Blocks this session opened (and how many times), by handle.
    opened: HandleTable<(Arc<SharedBlock>, u32)>,
    /// Base address → handle in `opened`.
    opened_at: BTreeMap<u64, u64>,
}

impl Default for PoolIpcState {
    fn default() -> Self {
        Self {
            exports: HandleTable::new(HandleKind::PoolShare),
            opened: HandleTable::new(HandleKind::PoolShare),
            opened_at: BTreeMap::new(),
        }
    }
}

impl PoolIpcState {
    /// Counts exports and opened blocks against `budget`.
    pub(in crate::session) fn set_budget(&mut self, budget: crate::limits::HandleBudget) {
        self.exports.set_budget(budget.clone());
        self.opened.set_budget(budget);
    }
}

fn split(t: u128) -> msg::Token {
    msg::Token {
        hi: (t >> 64) as u64,
        lo: t as u64,
    }
}

fn join(hi: u64, lo: u64) -> u128 {
    (u128::from(hi) << 64) | u128::from(lo)
}

impl Session {
    /// The pool sharing requests; `None` for other requests.
    pub(in crate::session) fn dispatch_pool_ipc(
        &mut self,
        req: &Request,
        out: &mut Vec<u8>,
    ) -> Option<Result<(), CuError>> {
        use Request as R;
        Some(match req {
            R::MemPoolExport(m) => self
                .pool_export(m.ctx, m.pool, m.handle_type)
                .and_then(|t| reply(out, split(t))),
            R::MemPoolImport(m) => self
                .pool_import(m.ctx, join(m.hi, m.lo))
                .and_then(|handle| reply(out, msg::Handle { handle })),
            R::MemPoolExportPointer(m) => self
                .pool_export_pointer(m.ctx, m.ptr)
                .and_then(|t| reply(out, split(t))),
            R::MemPoolImportPointer(m) => self
                .pool_import_pointer(m.ctx, m.pool, join(m.hi, m.lo))
                .and_then(|(base, size)| reply(out, msg::Range { base, size })),
            _ => return None,
        })
    }

    fn pool_export(&mut self, ctx: u64, pool: u64, handle_type: u32) -> Result<u128, CuError> {
        self.ctx(ctx)?;
        let p = self.pool(pool)?;
        if p.imported.is_some() {
            return Err(CuError::invalid_value(
                "an imported memory pool cannot be exported again",
            ));
        }
        if handle_type == 0 || p.handle_types & handle_type != handle_type {
            return Err(CuError::invalid_value(format!(
                "the pool was not created with handle type {handle_type:#x} among its export handle types ({:#x})",
                p.handle_types
            )));
        }
        if let Some((s, _)) = &p.share {
            return Ok(s.token);
        }
        // Budget first: a refused export leaves no token behind.
        let h = self.ext.pool_ipc.exports.insert(())?;
        let (owner, tenant) = (self.info.id, Arc::clone(&self.tenant));
        let mut shared = None;
        let token = TOKENS.enter(|token| {
            let s = Arc::new(SharedPool {
                token,
                owner,
                tenant: Arc::clone(&tenant),
            });
            let w = Arc::downgrade(&s);
            shared = Some(s);
            Shared::Pool(w)
        });
        let shared = shared.expect("enter_token made the pool's export");
        if let Some(p) = self.ext.pools.get_mut(pool) {
            p.share = Some((shared, h));
        }
        Ok(token)
    }

    /// Whether this session may import an export of `tenant` made by session `owner`: only
    /// another process of the same VM may.
    fn check_pool_importer(&self, tenant: &Arc<Tenant>, owner: u64) -> Result<(), CuError> {
        if !Arc::ptr_eq(tenant, &self.tenant) {
            tracing::warn!(
                tenant = %self.tenant.name,
                session = self.info.id,
                what = "memory pools",
                "refused a memory pool handle of another VM"
            );
            return Err(CuError::invalid_value(
                "this memory pool handle was exported by another VM: memory is never shared between VMs",
            ));
        }
        if owner == self.info.id {
            return Err(CuError::new(
                cuda::CUDA_ERROR_INVALID_CONTEXT,
                "a memory pool cannot be imported in the process that exported it",
            ));
        }
        Ok(())
    }

    fn pool_import(&mut self, ctx: u64, token: u128) -> Result<u64, CuError> {
        self.ctx(ctx)?;
        let found = match TOKENS.lock().get(&token) {
            Some(Shared::Pool(w)) => w.upgrade(),
            _ => None,
        };
        let Some(shared) = found else {
            return Err(CuError::invalid_value(
                "no memory pool of this VM was exported under this handle (or its exporter destroyed it)",
            ));
        };
        self.check_pool_importer(&shared.tenant, shared.owner)?;
        let mut p = PoolState::new(0, 0);
        p.imported = Some(shared);
        self.ext.pools.insert(p)
    }

    fn pool_export_pointer(&mut self, ctx: u64, ptr: u64) -> Result<u128, CuError> {
        self.ctx(ctx)?;
        let pool = match self.allocs.find(ptr) {
            Some((base, a)) if base == ptr => match a.kind {
                AllocKind::PoolBlock(pool) => pool,
                _ => {
                    return Err(CuError::invalid_value(format!(
                        "{ptr:#x} is not a block of a memory pool: only cuMemAllocAsync memory is exported with cuMemPoolExportPointer"
                    )));
                }
            },
            _ => {
                return Err(CuError::invalid_value(format!(
                    "{ptr:#x} is not the start of a live allocation of this process"
                )));
            }
        };
        let size = self.allocs.find(ptr).map_or(0, |(_, a)| a.size);
        let p = self.pool(pool)?;
        let Some((pool_share, _)) = &p.share else {
            return Err(CuError::invalid_value(if p.handle_types == 0 {
                "the block's pool was created without export handle types: its blocks cannot be exported"
            } else {
                "the block's pool has not been exported (cuMemPoolExportToShareableHandle)"
            }));
        };
        let pool_token = pool_share.token;
        let Some(b) = p.blocks.get(&ptr) else {
            return Err(CuError::invalid_value(format!(
                "{ptr:#x} is not a block of its pool"
            )));
        };
        if let Some((s, _)) = &b.shared {
            return Ok(s.token);
        }
        let charged = b.charged;
        let h = self.ext.pool_ipc.exports.insert(())?;
        let (owner, tenant, dev) = (
            self.info.id,
            Arc::clone(&self.tenant),
            Arc::clone(&self.dev),
        );
        let mut shared = None;
        let token = TOKENS.enter(|token| {
            let s = Arc::new(SharedBlock {
                token,
                pool: pool_token,
                base: ptr,
                size,
                charged,
                owner,
                tenant: Arc::clone(&tenant),
                dev: Arc::clone(&dev),
                orphan: Mutex::new(false),
            });
            let w = Arc::downgrade(&s);
            shared = Some(s);
            Shared::Block(w)
        });
        let shared = shared.expect("enter_token made the block's export");
        if let Some(b) = self
            .ext
            .pools
            .get_mut(pool)
            .and_then(|p| p.blocks.get_mut(&ptr))
        {
            b.shared = Some((shared, h));
        }
        Ok(token)
    }

    fn pool_import_pointer(
        &mut self,
        ctx: u64,
        pool: u64,
        token: u128,
    ) -> Result<(u64, u64), CuError> {
        self.ctx(ctx)?;
        let p = self.pool(pool)?;
        let Some(from) = &p.imported else {
            return Err(CuError::invalid_value(
                "cuMemPoolImportPointer takes a pool imported with cuMemPoolImportFromShareableHandle",
            ));
        };
        let from = from.token;
        let found = match TOKENS.lock().get(&token) {
            Some(Shared::Block(w)) => w.upgrade(),
            _ => None,
        };
        let Some(block) = found else {
            return Err(CuError::invalid_value(
                "no pool block of this VM was exported under this data (or its exporter freed it)",
            ));
        };
        self.check_pool_importer(&block.tenant, block.owner)?;
        if block.pool != from {
            return Err(CuError::invalid_value(
                "this pointer was exported from another pool than the one given",
            ));
        }
        let (base, size) = (block.base, block.size);
        if let Some(&h) = self.ext.pool_ipc.opened_at.get(&base)
            && let Some(e) = self.ext.pool_ipc.opened.get_mut(h)
        {
            e.1 = e.1.saturating_add(1);
            return Ok((base, size));
        }
        if self.allocs.find(base).is_some() {
            return Err(CuError::invalid_value(format!(
                "{base:#x} is already memory of this process"
            )));
        }
        let h = self.ext.pool_ipc.opened.insert((block, 1))?;
        self.ext.pool_ipc.opened_at.insert(base, h);
        self.allocs.insert(
            base,
            Allocation {
                size,
                charged: 0,
                ctx,
                kind: AllocKind::PoolImport,
            },
        );
        Ok((base, size))
    }

    /// `cuMemFree`/`cuMemFreeAsync` of an opened block: ends one opening (after this
    /// process's queued work); the last gives the block up.
    pub(super) fn pool_import_free(&mut self, base: u64) -> Result<(), CuError> {
        let Some(&h) = self.ext.pool_ipc.opened_at.get(&base) else {
            return Err(CuError::invalid_value(format!(
                "{base:#x} is not a pool block this process imported"
            )));
        };
        let last = match self.ext.pool_ipc.opened.get_mut(h) {
            Some(e) => {
                e.1 -= 1;
                e.1 == 0
            }
            None => true,
        };
        if last {
            // Queued work of this process may still use the block.
            self.engine.drain()?;
            self.pool_import_close(base);
        }
        Ok(())
    }

    /// Ends this session's opening of the block at `base` (every count); `false` when it
    /// opened none there.
    pub(in crate::session) fn pool_import_close(&mut self, base: u64) -> bool {
        let Some(h) = self.ext.pool_ipc.opened_at.remove(&base) else {
            return false;
        };
        self.allocs.remove(base);
        // The last reference of an orphaned block releases it.
        drop(self.ext.pool_ipc.opened.remove(h));
        true
    }

    /// A block of this session's pool that was exported is freed (or its pool goes with the
    /// session): its token ends; `true` when another process still has it open, so that it left the pool as an
    /// orphan (released with the last opening) and the caller must not reuse or free it.
    pub(super) fn pool_block_unshare(&mut self, share: BlockShare) -> bool {
        let (shared, h) = share;
        self.ext.pool_ipc.exports.remove(h);
        // No import can start once the token is gone, so the count below only falls.
        TOKENS.forget(shared.token);
        if Arc::strong_count(&shared) == 1 {
            return false;
        }
        *shared.orphan.lock().unwrap_or_else(|p| p.into_inner()) = true;
        true
    }

    /// The exporter destroyed (or ended with) `pool`: its token and its blocks' tokens end; the
    /// blocks other processes opened stay theirs.
    pub(super) fn pool_unshare(&mut self, pool: u64) {
        let Some(p) = self.ext.pools.get_mut(pool) else {
            return;
        };
        let share = p.share.take();
        let blocks: Vec<u128> = p
            .blocks
            .values()
            .filter_map(|b| b.shared.as_ref().map(|(s, _)| s.token))
            .collect();
        {
            let mut t = TOKENS.lock();
            for token in blocks {
                t.remove(&token);
            }
            if let Some((s, _)) = &share {
                t.remove(&s.token);
            }
        }
        if let Some((_, h)) = share {
            self.ext.pool_ipc.exports.remove(h);
        }
    }

    /// Closes every block this session opened (the session ended; its work was discarded).
    pub(in crate::session) fn release_pool_ipc(&mut self) {
        for base in self
            .ext
            .pool_ipc
            .opened_at
            .keys()
            .copied()
            .collect::<Vec<_>>()
        {
            self.pool_import_close(base);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use vgpu_proto::cuda;
    use vgpu_proto::msg;

    use super::super::HANDLE_TYPE_POSIX_FD;
    use crate::testutils::{MemDevice, TestClient, vm};

    type Client = TestClient<UnixStream>;
    const MIB: u64 = 1 << 20;

    /// A broker on the in-memory device with VMs `vm1` (handles budget `handles`) and `vm2`.
    fn broker(handles: u32) -> Arc<crate::Broker> {
        let dev: Arc<dyn crate::device::Device> = Arc::new(MemDevice::new(1 << 30, Duration::ZERO));
        let b = Arc::new(crate::Broker::new(vec![("gpu0".into(), dev)]));
        let mut v1 = vm("vm1", 64 * MIB);
        v1.limits.handles = handles;
        b.add_tenant(&v1).unwrap();
        b.add_tenant(&vm("vm2", 64 * MIB)).unwrap();
        b
    }

    /// A session (a process) of `tenant`, with a context.
    fn session(b: &Arc<crate::Broker>, tenant: &str) -> (Client, u64) {
        crate::testutils::serve_session(b, tenant)
    }

    fn call<O: msg::Op>(c: &mut Client, req: &O) -> Result<O::Reply, cuda::CuResult> {
        c.call(req, &[]).map(|r| r.0).map_err(|e| e.0)
    }

    fn pool(c: &mut Client, ctx: u64, handle_types: u32) -> u64 {
        call(
            c,
            &msg::MemPoolCreate {
                ctx,
                max_size: 0,
                handle_types,
            },
        )
        .unwrap()
        .handle
    }

    fn alloc(c: &mut Client, ctx: u64, pool: u64, size: u64) -> Result<u64, cuda::CuResult> {
        call(
            c,
            &msg::MemAllocAsync {
                ctx,
                stream: 0,
                pool,
                size,
            },
        )
        .map(|r| r.ptr)
    }

    fn export(c: &mut Client, ctx: u64, pool: u64) -> Result<msg::Token, cuda::CuResult> {
        call(
            c,
            &msg::MemPoolExport {
                ctx,
                pool,
                handle_type: HANDLE_TYPE_POSIX_FD,
            },
        )
    }

    fn import(c: &mut Client, ctx: u64, t: &msg::Token) -> Result<u64, cuda::CuResult> {
        call(
            c,
            &msg::MemPoolImport {
                ctx,
                hi: t.hi,
                lo: t.lo,
            },
        )
        .map(|r| r.handle)
    }

    fn export_ptr(c: &mut Client, ctx: u64, ptr: u64) -> Result<msg::Token, cuda::CuResult> {
        call(c, &msg::MemPoolExportPointer { ctx, ptr })
    }

    fn import_ptr(
        c: &mut Client,
        ctx: u64,
        pool: u64,
        t: &msg::Token,
    ) -> Result<u64, cuda::CuResult> {
        call(
            c,
            &msg::MemPoolImportPointer {
                ctx,
                pool,
                hi: t.hi,
                lo: t.lo,
            },
        )
        .map(|r| r.base)
    }

    fn free(c: &mut Client, ctx: u64, ptr: u64) -> Result<(), cuda::CuResult> {
        call(c, &msg::MemFree { ctx, ptr }).map(drop)
    }

    fn sync(c: &mut Client, ctx: u64) {
        call(c, &msg::CtxSynchronize { ctx }).unwrap();
    }

    fn reserved(c: &mut Client, pool: u64) -> u64 {
        call(
            c,
            &msg::MemPoolGetAttribute {
                pool,
                attribute: super::super::pool_attr::RESERVED_MEM_CURRENT,
            },
        )
        .unwrap()
        .bytes
    }

    fn wait_used(t: &crate::tenant::Tenant, want: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while t.slice.used() != want {
            assert!(
                Instant::now() < deadline,
                "{} used, want {want}",
                t.slice.used()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn pool_and_pointer_tokens_are_checked() {
        let b = broker(1024);
        let (mut a, actx) = session(&b, "vm1");
        let (mut other, octx) = session(&b, "vm1");
        let (mut foreign, fctx) = session(&b, "vm2");
        // A pool without export handle types exports neither itself nor its blocks.
        let plain = pool(&mut a, actx, 0);
        assert_eq!(
            export(&mut a, actx, plain),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        let pb = alloc(&mut a, actx, plain, MIB).unwrap();
        assert_eq!(
            export_ptr(&mut a, actx, pb),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        let p = pool(&mut a, actx, HANDLE_TYPE_POSIX_FD);
        let t = export(&mut a, actx, p).unwrap();
        assert_ne!((t.hi, t.lo), (0, 0));
        assert_eq!(export(&mut a, actx, p).unwrap(), t, "one token per pool");
        // Another VM, forged tokens and the exporting process are refused.
        assert_eq!(
            import(&mut foreign, fctx, &t),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        let forged = msg::Token {
            hi: t.hi,
            lo: t.lo ^ 1,
        };
        assert_eq!(
            import(&mut other, octx, &forged),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            import(&mut a, actx, &t),
            Err(cuda::CUDA_ERROR_INVALID_CONTEXT)
        );
        let imported = import(&mut other, octx, &t).unwrap();
        assert_eq!(
            alloc(&mut other, octx, imported, MIB),
            Err(cuda::CUDA_ERROR_INVALID_VALUE),
            "an imported pool allocates nothing"
        );
        assert_eq!(
            export(&mut other, octx, imported),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        let ptr = alloc(&mut a, actx, p, MIB).unwrap();
        assert_eq!(
            export_ptr(&mut a, actx, ptr + 64),
            Err(cuda::CUDA_ERROR_INVALID_VALUE),
            "a block is exported by its start"
        );
        let pt = export_ptr(&mut a, actx, ptr).unwrap();
        assert_ne!(pt, t);
        assert_eq!(export_ptr(&mut a, actx, ptr).unwrap(), pt);
        // A pool token is not a pointer token, a forged one opens nothing, nor does a
        // pool of this process that was not imported.
        assert_eq!(
            import_ptr(&mut other, octx, imported, &t),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        let forged = msg::Token {
            hi: pt.hi ^ 1,
            lo: pt.lo,
        };
        assert_eq!(
            import_ptr(&mut other, octx, imported, &forged),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        let own = pool(&mut other, octx, HANDLE_TYPE_POSIX_FD);
        assert_eq!(
            import_ptr(&mut other, octx, own, &pt),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        // Opened at the exporter's address, charged nothing more; a block of another pool of
        // the same exporter is refused through this one.
        let used = b.tenant("vm1").unwrap().slice.used();
        assert_eq!(import_ptr(&mut other, octx, imported, &pt), Ok(ptr));
        assert_eq!(b.tenant("vm1").unwrap().slice.used(), used);
        let p2 = pool(&mut a, actx, HANDLE_TYPE_POSIX_FD);
        export(&mut a, actx, p2).unwrap();
        let q = alloc(&mut a, actx, p2, MIB).unwrap();
        let qt = export_ptr(&mut a, actx, q).unwrap();
        assert_eq!(
            import_ptr(&mut other, octx, imported, &qt),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        // The importer's free closes its opening; a second is refused.
        free(&mut other, octx, ptr).unwrap();
        assert_eq!(
            free(&mut other, octx, ptr),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        // The exporter's destroy ends its tokens.
        free(&mut a, actx, ptr).unwrap();
        call(&mut a, &msg::MemPoolDestroy { ctx: actx, pool: p }).unwrap();
        let (mut late, lctx) = session(&b, "vm1");
        assert_eq!(
            import(&mut late, lctx, &t),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn a_block_freed_by_its_exporter_while_imported_leaves_the_pool_charged_once() {
        let b = broker(1024);
        let t1 = b.tenant("vm1").unwrap();
        let (mut a, actx) = session(&b, "vm1");
        let (mut other, octx) = session(&b, "vm1");
        let p = pool(&mut a, actx, HANDLE_TYPE_POSIX_FD);
        let t = export(&mut a, actx, p).unwrap();
        let ptr = alloc(&mut a, actx, p, 4 * MIB).unwrap();
        let used = t1.slice.used();
        assert!(used >= 4 * MIB);
        let pt = export_ptr(&mut a, actx, ptr).unwrap();
        let imported = import(&mut other, octx, &t).unwrap();
        assert_eq!(import_ptr(&mut other, octx, imported, &pt), Ok(ptr));
        assert_eq!(import_ptr(&mut other, octx, imported, &pt), Ok(ptr));
        assert_eq!(t1.slice.used(), used, "importing charges nothing");
        // The exporter frees it (stream-ordered): the block leaves the pool, still charged.
        call(
            &mut a,
            &msg::MemFreeAsync {
                ctx: actx,
                stream: 0,
                ptr,
            },
        )
        .unwrap();
        sync(&mut a, actx);
        assert_eq!(t1.slice.used(), used, "still open in another process");
        assert_eq!(reserved(&mut a, p), 0, "the block left its pool");
        // The pool does not hand it out again, and its token opens no more.
        let again = alloc(&mut a, actx, p, 4 * MIB).unwrap();
        assert_ne!(again, ptr, "an imported block is never reused");
        assert_eq!(t1.slice.used(), 2 * used);
        assert_eq!(
            import_ptr(&mut other, octx, imported, &pt),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        // The importer still writes it; its last free releases it.
        call(
            &mut other,
            &msg::Memset {
                ctx: octx,
                stream: 0,
                dst: ptr,
                value: 7,
                elem_size: 1,
                count: 16,
            },
        )
        .unwrap();
        free(&mut other, octx, ptr).unwrap();
        assert_eq!(t1.slice.used(), 2 * used);
        call(
            &mut other,
            &msg::MemFreeAsync {
                ctx: octx,
                stream: 0,
                ptr,
            },
        )
        .unwrap();
        sync(&mut other, octx);
        assert_eq!(t1.slice.used(), used);
        free(&mut a, actx, again).unwrap();
        wait_used(&t1, 0);
    }

    #[test]
    fn sessions_that_end_release_what_they_exported_and_imported() {
        let b = broker(1024);
        let t1 = b.tenant("vm1").unwrap();
        let (mut a, actx) = session(&b, "vm1");
        let p = pool(&mut a, actx, HANDLE_TYPE_POSIX_FD);
        let t = export(&mut a, actx, p).unwrap();
        let ptr = alloc(&mut a, actx, p, MIB).unwrap();
        let pt = export_ptr(&mut a, actx, ptr).unwrap();
        let used = t1.slice.used();
        // An importer that ends gives its opening back; the exporter still holds the block.
        {
            let (mut other, octx) = session(&b, "vm1");
            let imported = import(&mut other, octx, &t).unwrap();
            import_ptr(&mut other, octx, imported, &pt).unwrap();
        }
        let (mut other, octx) = session(&b, "vm1");
        let imported = import(&mut other, octx, &t).unwrap();
        import_ptr(&mut other, octx, imported, &pt).unwrap();
        assert_eq!(t1.slice.used(), used);
        // The exporter ends: the block stays with the importer, charged once.
        drop(a);
        let deadline = Instant::now() + Duration::from_secs(10);
        let (mut late, lctx) = session(&b, "vm1");
        while import(&mut late, lctx, &t) != Err(cuda::CUDA_ERROR_INVALID_VALUE) {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(t1.slice.used(), used);
        drop(other);
        wait_used(&t1, 0);
    }

    #[test]
    fn exports_imports_and_openings_count_against_the_handles_budget() {
        use vgpu_config::limits::Budget;
        let b = broker(1024);
        let t1 = b.tenant("vm1").unwrap();
        let (mut a, actx) = session(&b, "vm1");
        let (mut other, octx) = session(&b, "vm1");
        let p = pool(&mut a, actx, HANDLE_TYPE_POSIX_FD);
        let ptr = alloc(&mut a, actx, p, MIB).unwrap();
        let base = t1.limits.used(Budget::Handles);
        let t = export(&mut a, actx, p).unwrap();
        let pt = export_ptr(&mut a, actx, ptr).unwrap();
        let imported = import(&mut other, octx, &t).unwrap();
        import_ptr(&mut other, octx, imported, &pt).unwrap();
        assert_eq!(t1.limits.used(Budget::Handles), base + 4);
        free(&mut other, octx, ptr).unwrap();
        call(
            &mut other,
            &msg::MemPoolDestroy {
                ctx: octx,
                pool: imported,
            },
        )
        .unwrap();
        free(&mut a, actx, ptr).unwrap();
        assert_eq!(
            t1.limits.used(Budget::Handles),
            base + 1,
            "the pool's export"
        );

        let b = broker(8);
        let (mut a, actx) = session(&b, "vm1");
        let p = pool(&mut a, actx, HANDLE_TYPE_POSIX_FD);
        export(&mut a, actx, p).unwrap();
        let mut refused = None;
        for i in 0..64 {
            let ptr = alloc(&mut a, actx, p, 4096).unwrap();
            if let Err(e) = export_ptr(&mut a, actx, ptr) {
                refused = Some((i, e));
                break;
            }
        }
        let (i, e) = refused.expect("exports are bounded");
        assert!(i < 8, "{i} exports");
        assert_eq!(e, cuda::CUDA_ERROR_OUT_OF_MEMORY);
    }
}
