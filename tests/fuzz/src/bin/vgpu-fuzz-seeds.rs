//! Writes every fuzz target's seed inputs (`vgpu_fuzz::seeds`) to
//! `OUTDIR/<target>/seed-<n>`, the corpus layout cargo-fuzz reads:
//!
//! ```text
//! cargo run -p vgpu-fuzz --bin vgpu-fuzz-seeds -- fuzz/corpus
//! ```

use std::path::PathBuf;

fn main() {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: vgpu-fuzz-seeds OUTDIR");
        std::process::exit(2);
    };
    for &(name, _) in vgpu_fuzz::TARGETS {
        let dir = out.join(name);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!("vgpu-fuzz-seeds: cannot create {}: {e}", dir.display());
            std::process::exit(1);
        }
        let seeds = vgpu_fuzz::seeds(name);
        for (i, s) in seeds.iter().enumerate() {
            let p = dir.join(format!("seed-{i}"));
            if let Err(e) = std::fs::write(&p, s) {
                eprintln!("vgpu-fuzz-seeds: cannot write {}: {e}", p.display());
                std::process::exit(1);
            }
        }
        println!("{name}: {} seeds in {}", seeds.len(), dir.display());
    }
}
