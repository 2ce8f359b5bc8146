//! Replays every target's seeds and a deterministic burst of mutations of
//! them under the cost oracle: no input may panic, allocate more than
//! `MAX_INPUT_ALLOC` at its peak, or run longer than `MAX_INPUT_TIME` (with
//! slack for a loaded machine: the time limit is what a long libFuzzer run
//! enforces; here a slow input is reported with its size and time).
//!
//! `VGPU_FUZZ_MUTATIONS` sets the mutations per target (default 300).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use vgpu_fuzz::{MAX_INPUT_ALLOC, MAX_INPUT_TIME, Rng, TARGETS, mutate, seeds};

/// Counts live and peak bytes of this test process.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator with the caller's layout; the counters do not
// affect allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout (GlobalAlloc contract).
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout (GlobalAlloc contract).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The counters are process-wide: tests that measure run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The wall-clock allowance per input in this test: the oracle's limit
/// times a factor for a loaded 2-core machine and debug builds.
const TIME_SLACK: u32 = 10;

fn run(name: &str, f: vgpu_fuzz::Target, input: &[u8]) -> Result<(), String> {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let t = Instant::now();
    let r = std::panic::catch_unwind(|| f(input));
    let took = t.elapsed();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    if r.is_err() {
        return Err(format!("{name}: panicked on a {}-byte input", input.len()));
    }
    if peak > MAX_INPUT_ALLOC {
        return Err(format!(
            "{name}: a {}-byte input allocated {peak} bytes at its peak",
            input.len()
        ));
    }
    if took > MAX_INPUT_TIME * TIME_SLACK {
        return Err(format!("{name}: a {}-byte input ran {took:?}", input.len()));
    }
    Ok(())
}

#[test]
fn every_target_survives_its_seeds_and_their_mutations() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mutations: usize = std::env::var("VGPU_FUZZ_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut findings = Vec::new();
    let mut executions = 0usize;
    let start = Instant::now();
    for &(name, f) in TARGETS {
        let seeds = seeds(name);
        assert!(!seeds.is_empty(), "{name} has no seeds");
        let mut rng = Rng::new(0x5eed ^ name.len() as u64);
        for s in &seeds {
            executions += 1;
            if let Err(e) = run(name, f, s) {
                findings.push(e);
            }
        }
        let mut slowest = Duration::ZERO;
        for _ in 0..mutations {
            let a = &seeds[rng.below(seeds.len())];
            let b = &seeds[rng.below(seeds.len())];
            let input = mutate(a, b, &mut rng);
            let t = Instant::now();
            executions += 1;
            if let Err(e) = run(name, f, &input) {
                findings.push(e);
            }
            slowest = slowest.max(t.elapsed());
        }
        println!(
            "{name}: {} seeds, {mutations} mutations, slowest {slowest:?}",
            seeds.len()
        );
    }
    println!("{executions} executions in {:?}", start.elapsed());
    assert!(findings.is_empty(), "findings:\n{}", findings.join("\n"));
}

#[test]
fn the_oracle_catches_what_it_should() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    assert!(run("panic", |_| panic!("boom"), b"x").is_err());
    assert!(
        run(
            "hog",
            |_| drop(std::hint::black_box(vec![1u8; MAX_INPUT_ALLOC + 1])),
            b"x"
        )
        .is_err(),
        "a large allocation is a finding"
    );
    assert!(run("quiet", |_| {}, b"x").is_ok());
}
