//! Which GPU a `[[device]]` entry means: by index, by GPU UUID or by MIG
//! instance UUID, as `nvidia-smi -L` prints them.
//!
//! `cuDeviceGetUuid_v2` returns a MIG instance's own UUID on a MIG device and
//! the GPU's UUID otherwise, so both kinds are matched against it. A CUDA
//! process sees MIG instances only through `CUDA_VISIBLE_DEVICES` (read once,
//! at `cuInit`); [`mig_visibility`] decides what vgpud sets there.

use crate::error::CudaError;

/// Prefix of a GPU UUID.
pub const GPU_PREFIX: &str = "GPU-";
/// Prefix of a MIG instance UUID (R470 and later drivers).
pub const MIG_PREFIX: &str = "MIG-";
/// The variable CUDA reads at `cuInit` to decide which devices exist.
pub const VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// A device selector from the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// `index = N` (or nothing: device 0).
    Index(u32),
    /// `uuid = "GPU-…"`.
    Gpu([u8; 16]),
    /// `uuid = "MIG-…"`.
    Mig([u8; 16]),
}

impl Selector {
    /// The selector of a `kind = "cuda"` entry.
    pub fn from_config(index: Option<u32>, uuid: Option<&str>) -> Result<Selector, CudaError> {
        match uuid {
            Some(u) => parse_uuid(u),
            None => Ok(Selector::Index(index.unwrap_or(0))),
        }
    }

    /// Whether it names a MIG instance.
    pub fn is_mig(&self) -> bool {
        matches!(self, Selector::Mig(_))
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selector::Index(i) => write!(f, "index {i}"),
            Selector::Gpu(u) => f.write_str(&format_uuid(GPU_PREFIX, u)),
            Selector::Mig(u) => f.write_str(&format_uuid(MIG_PREFIX, u)),
        }
    }
}

/// Formats 16 UUID bytes like nvidia-smi: `GPU-2c5a9e1f-7d3b-4a8c-9e2f-0123456789ab`.
pub fn format_uuid(prefix: &str, u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{prefix}{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// Parses `GPU-…` or `MIG-…` (32 hex digits, dashes anywhere, any case).
pub fn parse_uuid(s: &str) -> Result<Selector, CudaError> {
    let bad = || CudaError::BadUuid(s.to_string());
    let (mig, rest) = if let Some(r) = s.strip_prefix(GPU_PREFIX) {
        (false, r)
    } else if let Some(r) = s.strip_prefix(MIG_PREFIX) {
        (true, r)
    } else {
        return Err(bad());
    };
    let hex: Vec<u8> = rest.bytes().filter(|&b| b != b'-').collect();
    if hex.len() != 32 {
        // Also the pre-R470 form MIG-GPU-<uuid>/<gi>/<ci>: not supported by drivers ≥ 12.0.
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).map_err(|_| bad())?;
        out[i] = u8::from_str_radix(text, 16).map_err(|_| bad())?;
    }
    Ok(if mig {
        Selector::Mig(out)
    } else {
        Selector::Gpu(out)
    })
}

/// Finds the ordinal a selector means among `uuids` (the driver's devices in
/// ordinal order, as `cuDeviceGetUuid_v2` reports them).
pub fn find(sel: &Selector, uuids: &[[u8; 16]]) -> Result<i32, CudaError> {
    let listed = || {
        if uuids.is_empty() {
            "no devices".to_string()
        } else {
            uuids
                .iter()
                .enumerate()
                .map(|(i, u)| format!("{i}: {}", &format_uuid("", u)))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    match sel {
        Selector::Index(i) => {
            if (*i as usize) < uuids.len() {
                Ok(*i as i32)
            } else {
                Err(CudaError::NoSuchIndex {
                    index: *i,
                    count: uuids.len() as i32,
                    listed: listed(),
                })
            }
        }
        Selector::Gpu(u) | Selector::Mig(u) => match uuids.iter().position(|x| x == u) {
            Some(i) => Ok(i as i32),
            None => Err(CudaError::NoSuchUuid {
                uuid: sel.to_string(),
                listed: listed(),
                hint: if sel.is_mig() {
                    format!(
                        " (a MIG instance is visible to CUDA only when {VISIBLE_DEVICES} names it: start vgpud with {VISIBLE_DEVICES}={sel})"
                    )
                } else {
                    String::new()
                },
            }),
        },
    }
}

/// What to do about `CUDA_VISIBLE_DEVICES` before `cuInit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visibility {
    /// Nothing: the driver's default enumeration (or the operator's setting) will do.
    Keep,
    /// Set the variable to this value before `cuInit`.
    Set(String),
}

/// Decides `CUDA_VISIBLE_DEVICES` for a process that opens the devices
/// `selectors`, given the variable's current value and whether the driver
/// is already initialised in this process.
///
/// CUDA enumerates MIG instances only when the variable names them, and a
/// CUDA process can use one MIG instance and no other GPU (NVIDIA's MIG user
/// guide, "CUDA Device Enumeration"). An operator's own setting is always
/// kept; it is checked when the device is looked up.
pub fn mig_visibility(
    selectors: &[Selector],
    current: Option<&str>,
    initialised: bool,
) -> Result<Visibility, CudaError> {
    let migs: Vec<&Selector> = selectors.iter().filter(|s| s.is_mig()).collect();
    let Some(first) = migs.first() else {
        return Ok(Visibility::Keep);
    };
    if current.is_some_and(|v| !v.trim().is_empty()) {
        return Ok(Visibility::Keep);
    }
    if migs.len() > 1 || selectors.len() > migs.len() {
        return Err(CudaError::Mig(format!(
            "{} and {} cannot be served by one vgpud: a CUDA process can use one MIG instance and no other GPU, so run one vgpud per MIG instance",
            selectors[0], selectors[1]
        )));
    }
    if initialised {
        return Err(CudaError::Mig(format!(
            "device {first} is a MIG instance, but the CUDA driver was initialised before it could be made visible: start vgpud with {VISIBLE_DEVICES}={first}"
        )));
    }
    Ok(Visibility::Set(first.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: [u8; 16] = [
        0x2c, 0x5a, 0x9e, 0x1f, 0x7d, 0x3b, 0x4a, 0x8c, 0x9e, 0x2f, 0x01, 0x23, 0x45, 0x67, 0x89,
        0xab,
    ];

    #[test]
    fn uuids_format_like_nvidia_smi() {
        assert_eq!(
            format_uuid(GPU_PREFIX, &U),
            "GPU-2c5a9e1f-7d3b-4a8c-9e2f-0123456789ab"
        );
        assert_eq!(
            format_uuid(MIG_PREFIX, &U),
            "MIG-2c5a9e1f-7d3b-4a8c-9e2f-0123456789ab"
        );
    }

    #[test]
    fn uuids_parse_back_in_any_case() {
        assert_eq!(
            parse_uuid("GPU-2c5a9e1f-7d3b-4a8c-9e2f-0123456789ab").unwrap(),
            Selector::Gpu(U)
        );
        assert_eq!(
            parse_uuid("MIG-2C5A9E1F-7D3B-4A8C-9E2F-0123456789AB").unwrap(),
            Selector::Mig(U)
        );
        for bad in [
            "2c5a9e1f-7d3b-4a8c-9e2f-0123456789ab",
            "GPU-2c5a9e1f-7d3b-4a8c-9e2f-0123456789a",
            "GPU-2c5a9e1f-7d3b-4a8c-9e2f-0123456789abcd",
            "GPU-zc5a9e1f-7d3b-4a8c-9e2f-0123456789ab",
            "MIG-GPU-2c5a9e1f-7d3b-4a8c-9e2f-0123456789ab/1/0",
            "GPU-2c5a9e1f-7d3b-4a8c-9e2f-0123456789é",
        ] {
            assert!(
                matches!(parse_uuid(bad), Err(CudaError::BadUuid(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn devices_are_found_by_index_and_uuid() {
        let mut other = U;
        other[15] = 0;
        let list = [other, U];
        assert_eq!(find(&Selector::Index(1), &list).unwrap(), 1);
        assert_eq!(find(&Selector::Gpu(U), &list).unwrap(), 1);
        assert_eq!(find(&Selector::Mig(other), &list).unwrap(), 0);
        let e = find(&Selector::Index(2), &list).unwrap_err();
        assert!(e.to_string().contains("lists 2 device(s)"), "{e}");
        let mut missing = U;
        missing[0] = 0;
        let e = find(&Selector::Gpu(missing), &list)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no CUDA device has UUID GPU-005a9e1f")
                && e.contains("1: 2c5a9e1f-7d3b-4a8c-9e2f-0123456789ab"),
            "{e}"
        );
        assert!(!e.contains(VISIBLE_DEVICES), "{e}");
        let e = find(&Selector::Mig(missing), &list)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("CUDA_VISIBLE_DEVICES=MIG-005a9e1f-7d3b-4a8c-9e2f-0123456789ab"),
            "{e}"
        );
        assert!(
            find(&Selector::Index(0), &[])
                .unwrap_err()
                .to_string()
                .contains("no devices")
        );
    }

    #[test]
    fn the_config_selects_index_zero_by_default() {
        assert_eq!(
            Selector::from_config(None, None).unwrap(),
            Selector::Index(0)
        );
        assert_eq!(
            Selector::from_config(Some(3), None).unwrap(),
            Selector::Index(3)
        );
        assert!(
            Selector::from_config(None, Some("MIG-2c5a9e1f7d3b4a8c9e2f0123456789ab"))
                .unwrap()
                .is_mig()
        );
    }

    #[test]
    fn mig_instances_are_made_visible_before_cuinit() {
        let mig = Selector::Mig(U);
        assert_eq!(
            mig_visibility(std::slice::from_ref(&mig), None, false).unwrap(),
            Visibility::Set("MIG-2c5a9e1f-7d3b-4a8c-9e2f-0123456789ab".into())
        );
        // An operator's setting wins; an empty one counts as unset.
        assert_eq!(
            mig_visibility(std::slice::from_ref(&mig), Some("MIG-abc"), false).unwrap(),
            Visibility::Keep
        );
        assert!(matches!(
            mig_visibility(std::slice::from_ref(&mig), Some(" "), false).unwrap(),
            Visibility::Set(_)
        ));
        // Too late once the driver is initialised.
        let e = mig_visibility(std::slice::from_ref(&mig), None, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("CUDA_VISIBLE_DEVICES=MIG-2c5a9e1f"), "{e}");
        // One MIG instance per process, and no whole GPU beside it.
        let e = mig_visibility(&[mig.clone(), Selector::Index(0)], None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("run one vgpud per MIG instance"), "{e}");
        let mut other = U;
        other[0] = 1;
        assert!(mig_visibility(&[mig, Selector::Mig(other)], None, false).is_err());
        // Whole GPUs need nothing.
        assert_eq!(
            mig_visibility(&[Selector::Index(0), Selector::Gpu(U)], None, true).unwrap(),
            Visibility::Keep
        );
    }
}
