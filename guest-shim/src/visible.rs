//! `CUDA_VISIBLE_DEVICES`, as NVIDIA's driver reads it at `cuInit`: which of the machine's GPUs
//! CUDA shows the process. Schedulers set it per process (Ray gives tasks without GPUs an empty
//! list; Slurm, vLLM and Kubernetes device plugins give indices or UUIDs), so a process that was
//! given no GPU must not get the VM's.
//!
//! The VM has one GPU, index 0. CUDA reads the list in order and stops at the first entry that
//! names no GPU; only the first entry can name the VM's GPU: its index (`0`) or its UUID
//! (`GPU-…`, a unique prefix is enough). An empty list, another index, another UUID, a MIG
//! instance or text that is none of these hides it: `cuInit` then fails with
//! `CUDA_ERROR_NO_DEVICE`, as on a machine whose listed GPUs are not there. NVML and vgpu-smi
//! do not read it (NVIDIA's NVML and nvidia-smi do not either).

/// The variable.
pub const VAR: &str = "CUDA_VISIBLE_DEVICES";
/// NVIDIA's UUID prefix.
const UUID_PREFIX: &str = "GPU-";

/// Whether a `CUDA_VISIBLE_DEVICES` value (`None`: unset) shows the VM's GPU, whose UUID is
/// `uuid` (`GPU-…`).
pub fn shows_the_gpu(value: Option<&str>, uuid: &str) -> bool {
    let Some(list) = value else {
        return true;
    };
    let first = list.split(',').next().unwrap_or("").trim();
    if let Ok(index) = first.parse::<i64>() {
        return index == 0;
    }
    let is_uuid = first
        .get(..UUID_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(UUID_PREFIX));
    is_uuid
        && first.len() > UUID_PREFIX.len()
        && uuid
            .get(..first.len())
            .is_some_and(|u| u.eq_ignore_ascii_case(first))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "GPU-185b03cc-73f1-8509-b127-55540bfe430b";

    #[test]
    fn unset_and_index_zero_show_the_gpu() {
        for v in [
            None,
            Some("0"),
            Some(" 0 "),
            Some("0,1"),
            Some("0,0"),
            Some("00"),
        ] {
            assert!(shows_the_gpu(v, UUID), "{v:?}");
        }
    }

    #[test]
    fn its_uuid_or_a_prefix_of_it_shows_the_gpu() {
        for v in [
            UUID,
            "GPU-185b03cc",
            "gpu-185B03CC-73f1",
            "GPU-185b03cc-73f1-8509-b127-55540bfe430b,1",
        ] {
            assert!(shows_the_gpu(Some(v), UUID), "{v:?}");
        }
    }

    #[test]
    fn anything_else_hides_it() {
        for v in [
            "",
            " ",
            "1",
            "-1",
            "1,0",
            "GPU-",
            "GPU-deadbeef",
            "GPU-185b03cc-73f1-8509-b127-55540bfe430b0",
            "MIG-185b03cc-73f1-8509-b127-55540bfe430b",
            "NoDevFiles",
            ",0",
            "é",
            "Gé€x",
            "GPU-185€",
        ] {
            assert!(!shows_the_gpu(Some(v), UUID), "{v:?}");
        }
    }
}
