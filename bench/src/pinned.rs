//! Pinned against pageable copies over the unix socket (issue 22): `cuMemcpyHtoD` /
//! `cuMemcpyDtoH` through the guest shim from and to a `cuMemAllocHost` buffer (a memfd shared
//! with vgpud: the copy is one memcpy in vgpud), a `cuMemHostRegister`ed `Vec` (its whole pages
//! moved into such a memfd; its ends, not page-aligned, travel in frames) and an unregistered
//! `Vec` (the bytes travel in frames), against the floor measured in the same run: memcpys
//! between the same pinned pages and a host buffer of the same size in transparent huge pages, as
//! the simulated GPU keeps the device memory, in the pieces vgpud copies in (what vgpud's copy
//! does at best).
//!
//! vgpud runs in this process on the simulated GPU, whose device memory is host memory.

use vgpu_config::Config;
use vgpu_hugemem::HugeMapping;
use vgpu_ptx::mem::copy_in_pieces;
use vgpud::Daemon;

use crate::stats::copy_rate;

const MIB: usize = 1 << 20;

/// Parameters.
#[derive(Debug, Clone)]
pub struct Params {
    /// Repetitions; medians and spreads are reported.
    pub runs: usize,
    /// Copy sizes in MiB.
    pub sizes_mib: Vec<usize>,
}

pub use crate::stats::Rate;

/// One size's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Row {
    /// Bytes per copy.
    pub bytes: usize,
    /// memcpy from the pinned pages to a host buffer.
    pub floor_htod: Rate,
    /// memcpy from a host buffer to the pinned pages.
    pub floor_dtoh: Rate,
    /// `cuMemcpyHtoD` from pinned memory.
    pub pinned_htod: Rate,
    /// `cuMemcpyDtoH` to pinned memory.
    pub pinned_dtoh: Rate,
    /// `cuMemcpyHtoD` from `cuMemHostRegister`ed memory.
    pub registered_htod: Rate,
    /// `cuMemcpyDtoH` to `cuMemHostRegister`ed memory.
    pub registered_dtoh: Rate,
    /// `cuMemcpyHtoD` from pageable memory.
    pub pageable_htod: Rate,
    /// `cuMemcpyDtoH` to pageable memory.
    pub pageable_dtoh: Rate,
}

/// The floor's copy: as vgpud copies, in pieces (`vgpu_ptx::mem::copy_in_pieces`, faster than
/// one `memcpy` on some hosts).
fn copy(dst: &mut [u8], src: &[u8]) {
    copy_in_pieces(dst, src);
    std::hint::black_box(&dst);
}

/// Runs the benchmark.
pub fn measure(p: &Params) -> Result<Vec<Row>, String> {
    use cuda::exports::*;
    if p.runs == 0 || p.sizes_mib.is_empty() || p.sizes_mib.contains(&0) {
        return Err("runs and sizes must be positive".into());
    }
    let max = p.sizes_mib.iter().max().copied().unwrap_or(1) * MIB;
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let sock = dir.path().join("bench.sock");
    let cfg = format!(
        "[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"{}MiB\"\n\n[[vm]]\nname = \"bench\"\nmemory = \"{}MiB\"\nunix_socket = \"{}\"\n",
        2 * max / MIB + 64,
        max / MIB + 32,
        sock.display()
    );
    let config = Config::parse(&dir.path().join("bench.toml"), &cfg).map_err(|e| e.to_string())?;
    let _daemon = Daemon::start(&config).map_err(|e| format!("starting vgpud: {e}"))?;
    // SAFETY: set before the shim reads it, before other threads of this process use the
    // environment.
    unsafe { std::env::set_var("VGPU_TRANSPORT", format!("unix:{}", sock.display())) };
    let ok = |r: u32, what: &str| {
        if r == 0 {
            Ok(())
        } else {
            Err(format!("{what} failed: CUresult {r}"))
        }
    };
    ok(cuInit(0), "cuInit")?;
    let mut ctx = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    ok(unsafe { cuCtxCreate_v2(&mut ctx, 0, 0) }, "cuCtxCreate")?;
    let mut dev = 0u64;
    // SAFETY: a valid out-pointer.
    ok(unsafe { cuMemAlloc_v2(&mut dev, max) }, "cuMemAlloc")?;
    let mut pinned_ptr = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let r = unsafe { cuMemAllocHost_v2(&mut pinned_ptr, max) };
    ok(r, "cuMemAllocHost")?;
    // SAFETY: cuMemAllocHost returned `max` writable bytes, ours until cuMemFreeHost below.
    let pinned = unsafe { std::slice::from_raw_parts_mut(pinned_ptr.cast::<u8>(), max) };
    pinned.fill(0x5a);
    let mut pageable = vec![0x5au8; max];
    let mut registered = vec![0x5au8; max];
    // The Vec's `max` bytes, registered until cuMemHostUnregister below, before it is dropped.
    let r = cuMemHostRegister_v2(registered.as_mut_ptr().cast(), max, 0);
    ok(r, "cuMemHostRegister")?;
    // In huge pages like the device memory the copies reach (see `vgpu_dev`'s floor), touched
    // now so that its pages exist before anything is timed.
    let mut host = HugeMapping::new(max).map_err(|e| format!("huge-page buffer: {e}"))?;
    host.fill(0);

    let mut rows = Vec::new();
    for &mib in &p.sizes_mib {
        let n = mib * MIB;
        // Floor HtoD and DtoH, then HtoD and DtoH from and to pinned, pageable and registered
        // memory.
        let mut runs: [Vec<f64>; 8] = Default::default();
        for _ in 0..p.runs {
            runs[0].push(copy_rate(n, || copy(&mut host[..n], &pinned[..n])));
            runs[1].push(copy_rate(n, || copy(&mut pinned[..n], &host[..n])));
            for (i, buf) in [&mut *pinned, &mut pageable[..], &mut registered[..]]
                .into_iter()
                .enumerate()
            {
                runs[2 + 2 * i].push(copy_rate(n, || {
                    // SAFETY: `dev` holds `max` bytes; the host buffer at least `n`.
                    let r = unsafe { cuMemcpyHtoD_v2(dev, buf.as_ptr().cast(), n) };
                    assert_eq!(r, 0);
                }));
                runs[3 + 2 * i].push(copy_rate(n, || {
                    // SAFETY: as above.
                    let r = unsafe { cuMemcpyDtoH_v2(buf.as_mut_ptr().cast(), dev, n) };
                    assert_eq!(r, 0);
                }));
            }
        }
        rows.push(Row {
            bytes: n,
            floor_htod: Rate::of(&runs[0]),
            floor_dtoh: Rate::of(&runs[1]),
            pinned_htod: Rate::of(&runs[2]),
            pinned_dtoh: Rate::of(&runs[3]),
            pageable_htod: Rate::of(&runs[4]),
            pageable_dtoh: Rate::of(&runs[5]),
            registered_htod: Rate::of(&runs[6]),
            registered_dtoh: Rate::of(&runs[7]),
        });
    }
    // The buffer from cuMemAllocHost above, no longer used.
    ok(cuMemFreeHost(pinned_ptr), "cuMemFreeHost")?;
    ok(
        cuMemHostUnregister(registered.as_mut_ptr().cast()),
        "cuMemHostUnregister",
    )?;
    ok(cuMemFree_v2(dev), "cuMemFree")?;
    Ok(rows)
}

fn gbs(r: Rate) -> String {
    r.gbs()
}

/// The report: GB/s (median, lowest–highest run) and each copy's share of its floor.
pub fn report(rows: &[Row], runs: usize) -> String {
    let mut s = format!(
        "pinned: cuMemcpyHtoD/DtoH over the unix socket, simulated GPU, {runs} runs \
         (GB/s: median (lowest-highest)); floor = memcpy between the same pinned pages and \
         host memory in huge pages, in vgpud's {piece} KiB pieces; pinned = cuMemAllocHost, \
         registered = a cuMemHostRegister'ed Vec, pageable = a Vec\n",
        piece = vgpu_ptx::mem::COPY_PIECE >> 10
    );
    s.push_str(&format!(
        "{:>8} {:>6} {:>22} {:>22} {:>22} {:>22} {:>9} {:>9} {:>9}\n",
        "size", "dir", "floor", "pinned", "registered", "pageable", "pinned", "regist.", "pageable"
    ));
    for r in rows {
        for (dir, floor, pinned, registered, pageable) in [
            (
                "HtoD",
                r.floor_htod,
                r.pinned_htod,
                r.registered_htod,
                r.pageable_htod,
            ),
            (
                "DtoH",
                r.floor_dtoh,
                r.pinned_dtoh,
                r.registered_dtoh,
                r.pageable_dtoh,
            ),
        ] {
            let pct = |v: Rate| 100.0 * v.median / floor.median;
            s.push_str(&format!(
                "{:>5} MiB {:>6} {:>22} {:>22} {:>22} {:>22} {:>8.0}% {:>8.0}% {:>8.0}%\n",
                r.bytes / MIB,
                dir,
                gbs(floor),
                gbs(pinned),
                gbs(registered),
                gbs(pageable),
                pct(pinned),
                pct(registered),
                pct(pageable)
            ));
        }
    }
    s
}

/// Runs the benchmark and prints its report.
pub fn run(p: &Params) -> Result<Vec<Row>, String> {
    let rows = measure(p)?;
    print!("{}", report(&rows, p.runs));
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_shows_shares_of_the_floor() {
        let r = |m: f64| Rate {
            median: m,
            min: m * 0.9,
            max: m * 1.1,
        };
        let row = Row {
            bytes: 16 * MIB,
            floor_htod: r(10e9),
            floor_dtoh: r(10e9),
            pinned_htod: r(9.5e9),
            pinned_dtoh: r(9e9),
            pageable_htod: r(3e9),
            pageable_dtoh: r(2e9),
            registered_htod: r(8.5e9),
            registered_dtoh: r(8e9),
        };
        let s = report(&[row], 5);
        assert!(
            s.contains("95%") && s.contains("85%") && s.contains("30%") && s.contains("20%"),
            "{s}"
        );
        assert!(s.contains("9.50 (8.55-10.45)"), "{s}");
    }

    #[test]
    fn bad_parameters_are_refused() {
        let p = Params {
            runs: 0,
            sizes_mib: vec![1],
        };
        assert!(measure(&p).is_err());
    }
}
