//! Device-side `printf` (`vprintf`), `assert` (`__assertfail`) and `cudaGraphSetConditional`
//! as NVRTC compiles them.

use std::sync::{Arc, Mutex};

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

/// `cudaGraphSetConditional` as NVRTC 12.9 compiles it (CUDA's device runtime; the local
/// toolkit predates it, so no generated fixture):
///
/// ```cuda
/// extern "C" __global__ void set_value(cudaGraphConditionalHandle h, unsigned v)
/// {
///     cudaGraphSetConditional(h, v);
/// }
///
/// extern "C" __global__ void set_lanes(cudaGraphConditionalHandle h, unsigned n)
/// {
///     if (threadIdx.x < n) cudaGraphSetConditional(h, threadIdx.x * 10 + 1);
/// }
/// ```
const SET_CONDITIONAL: &str = r#"
.version 8.3
.target sm_80
.address_size 64

	// .globl	set_value
.extern .func cudaGraphSetConditional
(
	.param .b64 cudaGraphSetConditional_param_0,
	.param .b32 cudaGraphSetConditional_param_1
)
;

.visible .entry set_value(
	.param .u64 set_value_param_0,
	.param .u32 set_value_param_1
)
{
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<2>;


	ld.param.u64 	%rd1, [set_value_param_0];
	ld.param.u32 	%r1, [set_value_param_1];
	{ // callseq 0, 0
	.param .b64 param0;
	st.param.b64 	[param0+0], %rd1;
	.param .b32 param1;
	st.param.b32 	[param1+0], %r1;
	call.uni
	cudaGraphSetConditional,
	(
	param0,
	param1
	);
	} // callseq 0
	ret;

}
	// .globl	set_lanes
.visible .entry set_lanes(
	.param .u64 set_lanes_param_0,
	.param .u32 set_lanes_param_1
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<2>;


	ld.param.u64 	%rd1, [set_lanes_param_0];
	ld.param.u32 	%r2, [set_lanes_param_1];
	mov.u32 	%r1, %tid.x;
	setp.ge.u32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB1_2;

	mad.lo.s32 	%r3, %r1, 10, 1;
	{ // callseq 1, 0
	.param .b64 param0;
	st.param.b64 	[param0+0], %rd1;
	.param .b32 param1;
	st.param.b32 	[param1+0], %r3;
	call.uni
	cudaGraphSetConditional,
	(
	param0,
	param1
	);
	} // callseq 1

$L__BB1_2:
	ret;

}
"#;

/// A conditional handle of the test's graph launch (all 64 bits count).
const HANDLE: u64 = 0x7f00_0000_0000_0001;
/// Another handle of the launch, which the kernels leave alone.
const OTHER: u64 = 0x7f00_0000_0000_0002;
/// A handle the launch does not have.
const UNKNOWN: u64 = 0xdead_beef_0000_0003;
/// The value both handles start with.
const START: u32 = 0;
/// The value `set_lanes` gives lane `l`: `l * LANE_STEP + 1`.
const LANE_STEP: u32 = 10;

/// A graph launch's conditional handles that records every `set`, in order.
#[derive(Debug)]
struct TestConditionals {
    values: Mutex<Vec<(u64, u32)>>,
    calls: Mutex<Vec<(u64, u32)>>,
}

impl TestConditionals {
    fn new(handles: &[u64]) -> Arc<TestConditionals> {
        Arc::new(TestConditionals {
            values: Mutex::new(handles.iter().map(|&h| (h, START)).collect()),
            calls: Mutex::new(Vec::new()),
        })
    }

    fn get(&self, handle: u64) -> Option<u32> {
        let values = self.values.lock().unwrap();
        values.iter().find(|&&(h, _)| h == handle).map(|&(_, v)| v)
    }

    fn calls(&self) -> Vec<(u64, u32)> {
        self.calls.lock().unwrap().clone()
    }
}

impl GraphConditionals for TestConditionals {
    fn set(&self, handle: u64, value: u32) -> bool {
        self.calls.lock().unwrap().push((handle, value));
        let mut values = self.values.lock().unwrap();
        match values.iter_mut().find(|(h, _)| *h == handle) {
            Some((_, v)) => {
                *v = value;
                true
            }
            None => false,
        }
    }
}

fn launch_conditional(
    kernel: &str,
    cfg: &Config,
    args: &[Arg],
    conditionals: Option<Arc<TestConditionals>>,
) -> Result<Progress, Fault> {
    let m = Module::load(SET_CONDITIONAL).unwrap();
    let mem = TestMemory::new();
    let params = pack_params(m.kernel(kernel).unwrap(), args);
    let control = LaunchControl::new();
    control.set_conditionals(conditionals.map(|c| c as Arc<dyn GraphConditionals>));
    m.launch(&Launch {
        kernel,
        grid: cfg.grid,
        block: cfg.block,
        dynamic_shared: cfg.dynamic_shared,
        params: &params,
        globals: &alloc_globals(&m, &mem),
        memory: &mem,
        start_block: 0,
        workers: cfg.workers,
        control: &control,
    })
}

#[test]
fn a_module_declaring_cuda_graph_set_conditional_loads() {
    let m = Module::load(SET_CONDITIONAL).unwrap();
    let names: Vec<&str> = m.kernels().iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["set_value", "set_lanes"]);

    // Only CUDA's signature is the builtin: another one is an undefined external function.
    let wrong = SET_CONDITIONAL.replace(
        ".param .b32 cudaGraphSetConditional_param_1",
        ".param .b64 cudaGraphSetConditional_param_1",
    );
    let e = Module::load(&wrong).unwrap_err();
    assert!(
        e.message
            .contains("call to external function `cudaGraphSetConditional`"),
        "{e}"
    );
}

#[test]
fn cuda_graph_set_conditional_sets_its_handle_only() {
    const VALUE: u32 = 0x8000_0007;
    let c = TestConditionals::new(&[HANDLE, OTHER]);
    launch_conditional(
        "set_value",
        &Config::linear(1, 1),
        &[Arg::U64(HANDLE), Arg::U32(VALUE)],
        Some(Arc::clone(&c)),
    )
    .unwrap();
    assert_eq!(c.get(HANDLE), Some(VALUE));
    assert_eq!(c.get(OTHER), Some(START));
    assert_eq!(c.calls(), [(HANDLE, VALUE)]);
}

#[test]
fn cuda_graph_set_conditional_runs_in_lane_order_and_the_last_lane_wins() {
    const LANES: u32 = 32;
    const DIVERGENT: u32 = 7;
    for n in [LANES, DIVERGENT] {
        let c = TestConditionals::new(&[HANDLE, OTHER]);
        launch_conditional(
            "set_lanes",
            &Config::linear(1, LANES),
            &[Arg::U64(HANDLE), Arg::U32(n)],
            Some(Arc::clone(&c)),
        )
        .unwrap();
        let want: Vec<(u64, u32)> = (0..n).map(|l| (HANDLE, l * LANE_STEP + 1)).collect();
        assert_eq!(c.calls(), want, "{n} lanes call it, in lane order");
        assert_eq!(c.get(HANDLE), Some((n - 1) * LANE_STEP + 1), "{n} lanes");
        assert_eq!(c.get(OTHER), Some(START));
    }
}

#[test]
fn cuda_graph_set_conditional_outside_a_graph_launch_faults() {
    let f = launch_conditional(
        "set_value",
        &Config::linear(1, 1),
        &[Arg::U64(HANDLE), Arg::U32(1)],
        None,
    )
    .unwrap_err();
    assert_eq!(f.kind, FaultKind::IllegalInstruction, "{f}");
    assert_eq!(f.cuda_error(), CUDA_ERROR_ILLEGAL_INSTRUCTION);
    assert!(f.is_sticky());
    assert!(
        f.message.starts_with(
            "cudaGraphSetConditional: 0x7f00000000000001 is not a conditional handle of the graph launch this kernel runs in: it runs outside any graph launch with conditional nodes (in kernel `set_value`"
        ),
        "{f}"
    );
}

#[test]
fn cuda_graph_set_conditional_of_an_unknown_handle_faults() {
    let c = TestConditionals::new(&[HANDLE, OTHER]);
    let f = launch_conditional(
        "set_lanes",
        &Config::linear(1, 32),
        &[Arg::U64(UNKNOWN), Arg::U32(32)],
        Some(Arc::clone(&c)),
    )
    .unwrap_err();
    assert_eq!(f.kind, FaultKind::IllegalInstruction, "{f}");
    assert_eq!(f.cuda_error(), CUDA_ERROR_ILLEGAL_INSTRUCTION);
    assert!(
        f.message.starts_with(
            "cudaGraphSetConditional: 0xdeadbeef00000003 is not a conditional handle of the graph launch this kernel runs in (in kernel `set_lanes`"
        ),
        "{f}"
    );
    assert!(f.message.contains("thread (0, 0, 0)"), "{f}");
    // The first lane's call faulted: nothing else was asked, nothing changed.
    assert_eq!(c.calls(), [(UNKNOWN, 1)]);
    assert_eq!(c.get(HANDLE), Some(START));
    assert_eq!(c.get(OTHER), Some(START));
}
