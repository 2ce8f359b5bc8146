//! The host's own copy speed: one `memcpy` of the whole size against the same bytes copied in the
//! simulated GPU's pieces ([`vgpu_ptx::mem::copy_in_pieces`], how vgpud moves bulk bytes into
//! and out of device memory), between two buffers in transparent huge pages as the device memory
//! is. The two alternate within each run, so that the machine's drifts weigh on both alike.
//!
//! This is the floor the copy benchmarks (`vgpu-dev`, `pinned`) measure the devices against, and
//! why it is copied in pieces: with glibc on AMD CPUs one `memcpy` of at least the L2 cache's size
//! leaves `rep movsb` for slower code (docs/performance.md, "Host copies in pieces").

use vgpu_hugemem::HugeMapping;
use vgpu_ptx::mem::{COPY_PIECE, copy_in_pieces};

use crate::stats::{Rate, copy_rate, spread};

const MIB: usize = 1 << 20;
/// Samples of each kind per run, alternating; the run's figure is their median.
const SAMPLES_PER_RUN: usize = 5;

/// Parameters: repetitions and copy sizes in MiB, as `pinned` takes them.
pub use crate::pinned::Params;

/// One size's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Row {
    /// Bytes per copy.
    pub bytes: usize,
    /// One `memcpy` of the whole size.
    pub whole: Rate,
    /// The same bytes in pieces of [`COPY_PIECE`].
    pub pieces: Rate,
    /// `pieces / whole` per run: median, lowest, highest.
    pub ratio: Rate,
}

/// Runs the benchmark.
pub fn measure(p: &Params) -> Result<Vec<Row>, String> {
    if p.runs == 0 || p.sizes_mib.is_empty() || p.sizes_mib.contains(&0) {
        return Err("runs and sizes must be positive".into());
    }
    let max = p.sizes_mib.iter().max().copied().unwrap_or(1) * MIB;
    let huge = |fill: u8| -> Result<HugeMapping, String> {
        let mut m = HugeMapping::new(max).map_err(|e| format!("huge-page buffer: {e}"))?;
        // Touched before anything is timed, so that the huge pages exist.
        m.fill(fill);
        Ok(m)
    };
    let (src, mut dst) = (huge(0x5a)?, huge(0xa5)?);
    let mut rows = Vec::new();
    for &mib in &p.sizes_mib {
        let bytes = mib * MIB;
        let (src, dst) = (&src[..bytes], &mut dst[..bytes]);
        let (mut whole, mut pieces, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..p.runs {
            let (mut w, mut pc) = (Vec::new(), Vec::new());
            for _ in 0..SAMPLES_PER_RUN {
                w.push(copy_rate(bytes, || {
                    dst.copy_from_slice(std::hint::black_box(src));
                    std::hint::black_box(&mut *dst);
                }));
                pc.push(copy_rate(bytes, || {
                    copy_in_pieces(dst, std::hint::black_box(src));
                    std::hint::black_box(&mut *dst);
                }));
            }
            let (w, pc) = (spread(&w).0, spread(&pc).0);
            whole.push(w);
            pieces.push(pc);
            ratio.push(pc / w);
        }
        if dst != src {
            return Err(format!("a {mib} MiB copy in pieces lost bytes"));
        }
        rows.push(Row {
            bytes,
            whole: Rate::of(&whole),
            pieces: Rate::of(&pieces),
            ratio: Rate::of(&ratio),
        });
    }
    Ok(rows)
}

/// The report: GB/s (median, lowest–highest run) and the ratio of pieces to one `memcpy`.
pub fn report(rows: &[Row], runs: usize) -> String {
    let mut s = format!(
        "memcpy: host copies between two transparent-huge-page buffers, {runs} runs (GB/s: \
         median (lowest-highest)); whole = one memcpy of the size, pieces = the same bytes in \
         the simulated GPU's {} KiB pieces (vgpu_ptx::mem::copy_in_pieces)\n",
        COPY_PIECE >> 10
    );
    s.push_str(&format!(
        "{:>8} {:>22} {:>22} {:>24}\n",
        "size", "whole", "pieces", "pieces / whole"
    ));
    for r in rows {
        s.push_str(&format!(
            "{:>4} MiB {:>22} {:>22} {:>24}\n",
            r.bytes / MIB,
            r.whole.gbs(),
            r.pieces.gbs(),
            format!(
                "{:.3}x ({:.3}-{:.3})",
                r.ratio.median, r.ratio.min, r.ratio.max
            )
        ));
    }
    s
}

/// Runs the benchmark and prints the report.
pub fn run(p: &Params) -> Result<Vec<Row>, String> {
    let rows = measure(p)?;
    print!("{}", report(&rows, p.runs));
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_copies_are_measured_and_bad_parameters_refused() {
        let rows = measure(&Params {
            runs: 1,
            sizes_mib: vec![1],
        })
        .unwrap();
        assert_eq!(rows.len(), 1);
        let r = rows[0];
        assert!(r.whole.median > 0.0 && r.pieces.median > 0.0, "{r:?}");
        assert!((r.ratio.median - r.pieces.median / r.whole.median).abs() < 1e-9);
        assert!(report(&rows, 1).contains("pieces / whole"));
        for bad in [(0, vec![1]), (1, vec![]), (1, vec![0])] {
            assert!(
                measure(&Params {
                    runs: bad.0,
                    sizes_mib: bad.1
                })
                .is_err()
            );
        }
    }
}
