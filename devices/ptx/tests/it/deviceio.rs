//! Device-side `printf` (`vprintf`) and `assert` (`__assertfail`) as NVRTC compiles them.

use std::sync::Arc;

use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

fn launch(
    m: &Module,
    kernel: &str,
    cfg: &Config,
    args: &[Arg],
    mem: &TestMemory,
    out: Option<Arc<TestOutput>>,
) -> Result<Progress, Fault> {
    let g = alloc_globals(m, mem);
    let params = pack_params(m.kernel(kernel).unwrap(), args);
    let control = LaunchControl::new();
    control.set_output(out.map(|o| o as Arc<dyn DeviceOutput>));
    m.launch(&Launch {
        kernel,
        grid: cfg.grid,
        block: cfg.block,
        dynamic_shared: cfg.dynamic_shared,
        params: &params,
        globals: &g,
        memory: mem,
        start_block: 0,
        workers: cfg.workers,
        control: &control,
    })
}

#[test]
fn printf_formats_its_arguments() {
    for arch in ARCHS {
        let m = load_fixture("deviceio", arch);
        let mem = TestMemory::new();
        let s = mem.alloc_from(b"str\0");
        let out = Arc::new(TestOutput::new(1 << 20));
        launch(
            &m,
            "formats",
            &Config::linear(1, 32),
            &[
                Arg::U64(s),
                Arg::F32(9.87654),
                Arg::F64(6.02e23),
                Arg::I64(-1_234_567_890_123),
            ],
            &mem,
            Some(Arc::clone(&out)),
        )
        .unwrap();
        assert_eq!(
            out.stdout(),
            "d=-7 u=42 x=0xbeef lld=-1234567890123 f=9.877 e=6.02e+23 g=6.02e+23 s=str c=Z p=%\n\
             returned 9\n",
            "{arch}"
        );
        assert_eq!(out.stderr(), "");
    }
}

#[test]
fn printf_from_every_block_and_lane() {
    for arch in ARCHS {
        let m = load_fixture("deviceio", arch);
        let mem = TestMemory::new();
        let out = Arc::new(TestOutput::new(1 << 20));
        let cfg = Config {
            workers: 3,
            ..Config::linear(4, 64)
        };
        launch(
            &m,
            "hello",
            &cfg,
            &[Arg::I32(1234)],
            &mem,
            Some(Arc::clone(&out)),
        )
        .unwrap();
        let text = out.stdout();
        for b in 0..4 {
            let line = format!("block {b} of 4 says hello (tag 1234)\n");
            assert_eq!(text.matches(&line).count(), 1, "{arch}: {text}");
        }
        assert_eq!(text.lines().count(), 4);

        let out = Arc::new(TestOutput::new(1 << 20));
        launch(
            &m,
            "lanes",
            &Config::linear(1, 32),
            &[],
            &mem,
            Some(Arc::clone(&out)),
        )
        .unwrap();
        let want: String = (0..32).map(|l| format!("lane {l:02}\n")).collect();
        assert_eq!(out.stdout(), want, "{arch}: one warp prints in lane order");
    }
}

#[test]
fn printf_output_past_the_fifo_is_dropped_whole() {
    let m = load_fixture("deviceio", "compute_80");
    let mem = TestMemory::new();
    // Room for 10 lines of "lane NN\n" (8 bytes each) and a bit.
    let out = Arc::new(TestOutput::new(85));
    launch(
        &m,
        "lanes",
        &Config::linear(2, 64),
        &[],
        &mem,
        Some(Arc::clone(&out)),
    )
    .unwrap();
    let text = out.stdout();
    assert_eq!(text.len(), 80, "{text}");
    assert!(text.lines().all(|l| l.starts_with("lane ") && l.len() == 7));
}

#[test]
fn printf_without_an_output_prints_nothing() {
    let m = load_fixture("deviceio", "compute_52");
    let mem = TestMemory::new();
    launch(&m, "lanes", &Config::linear(1, 32), &[], &mem, None).unwrap();
}

#[test]
fn a_failed_assert_stops_the_kernel_with_cuda_error_assert() {
    for arch in ARCHS {
        let m = load_fixture("deviceio", arch);
        let mem = TestMemory::new();
        let v: Vec<i32> = (0..64).collect();
        let p = mem.alloc_from(&v);
        let out = Arc::new(TestOutput::new(1 << 20));
        let f = launch(
            &m,
            "check",
            &Config::linear(2, 32),
            &[Arg::U64(p), Arg::I32(64)],
            &mem,
            Some(Arc::clone(&out)),
        )
        .unwrap_err();
        assert_eq!(f.kind, FaultKind::Assert, "{arch}: {f}");
        assert_eq!(f.cuda_error(), CUDA_ERROR_ASSERT);
        assert!(f.is_sticky());
        let err = out.stderr();
        assert!(
            err.starts_with("deviceio.cu:")
                && err.ends_with(
                    ": check: block: [0,0,0], thread: [13,0,0] Assertion `v[i] != 13` failed.\n"
                ),
            "{arch}: {err}"
        );
        assert_eq!(err.lines().count(), 1);
        assert!(f.message.contains("thread (13, 0, 0)"), "{f}");

        // No element is 13 past the first 13: the assert holds everywhere.
        let ok = mem.alloc_from(&vec![1i32; 64]);
        launch(
            &m,
            "check",
            &Config::linear(2, 32),
            &[Arg::U64(ok), Arg::I32(64)],
            &mem,
            None,
        )
        .unwrap();
    }
}
