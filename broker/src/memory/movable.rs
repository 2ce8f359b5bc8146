//! Plain allocations (`cuMemAlloc*`), the ones that can move between device
//! and host memory: placed by the device's ledger, made where it says, and
//! tracked so that they can be demoted and promoted later.

use std::sync::Arc;

use super::placement::TenantMemory;
use crate::device::{DeviceContext, DeviceError, Residence};
use crate::error::CuError;
use crate::tenant::Tenant;

/// Charges `charged` bytes to `tenant`'s slice, places them (device or host memory),
/// allocates `size` bytes there in `dev` and tracks the allocation; on failure nothing stays
/// charged.
pub fn allocate(
    pm: &Arc<TenantMemory>,
    tenant: &Tenant,
    dev: &Arc<dyn DeviceContext>,
    size: u64,
    charged: u64,
) -> Result<u64, CuError> {
    tenant.slice.charge_unplaced(charged)?;
    let undo = |res: Residence, e: CuError| {
        pm.unplace(charged, res);
        tenant.slice.refund_unplaced(charged);
        e
    };
    let res = pm
        .place(charged)
        .inspect_err(|_| tenant.slice.refund_unplaced(charged))?;
    let made = match res {
        Residence::Device => dev.alloc(size),
        Residence::Host => dev.alloc_host(size),
    };
    let (ptr, res) = match made {
        Ok(p) => (p, res),
        // The ledger had room but the device had not (memory the ledger does not see, such as
        // a real GPU's own use): overflow if the VM may.
        Err(DeviceError::OutOfMemory)
            if res == Residence::Device && pm.fall_back_to_host(charged) =>
        {
            match dev.alloc_host(size) {
                Ok(p) => (p, Residence::Host),
                Err(e) => return Err(undo(Residence::Host, e.into())),
            }
        }
        Err(DeviceError::NotSupported(m)) if res == Residence::Host => {
            return Err(undo(
                res,
                CuError::out_of_memory(format!("the device is full and cannot overflow: {m}")),
            ));
        }
        Err(e) => return Err(undo(res, e.into())),
    };
    pm.track(ptr, charged, res, Arc::clone(dev));
    Ok(ptr)
}
