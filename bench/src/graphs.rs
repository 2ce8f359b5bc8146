//! The cost of a CUDA graph launch: a graph of `kernels` small kernels replayed with one request,
//! against the same kernels launched one by one, in the same run; amortized per kernel.
//!
//! Paths, each against an in-process vgpud on the simulated GPU:
//! - the guest shim's C ABI over a unix socket: the graph is made by stream capture and launched
//!   with `cuGraphLaunch`; the baseline is `cuLaunchKernel` on the same stream;
//! - the shim's protocol client over the unix socket and over the vhost-user vsock device (an
//!   in-process frontend, as in `vgpu-bench vhost`): `GraphLaunch` vs `LaunchKernel` requests.
//!
//! Two figures per path: *submit*, the time the caller spends issuing the work (the launches or
//! the one graph launch), and *end to end*, issuing plus waiting for completion
//! (`cuStreamSynchronize`). Medians over runs, with the spread (lowest and highest run).
//!
//! *Fork/join* (over the protocol client and the unix socket): a graph of two independent
//! branches of [`BRANCH_KERNELS`] longer kernels (about [`BRANCH_KERNEL_TARGET`] each) against the
//! same kernels in one chain, launch to completion, in the same run. vgpud runs a graph's
//! independent branches at the same time, so on a device with room for both the branches take
//! about half the chain's time.
//!
//! *Loop* (over the protocol client, on the unix socket and the vsock device): [`LOOP_ITERATIONS`]
//! iterations of a one-thread kernel, driven on the device by a while node of a graph (its kernel
//! counts down and sets the node's handle with `cudaGraphSetConditional`: one request, no round
//! trip per iteration) against the same loop driven by the host as a program without conditional
//! nodes does (a launch and a synchronous read of the counter per iteration), in the same run;
//! per iteration.

use std::path::Path;
use std::time::{Duration, Instant};

use cuda::client::Client;
use vgpu_config::Config;
use vgpu_proto::graph::{CONDITIONAL_NODE, conditional, push_body, push_deps, push_node, push_op};
use vgpu_proto::msg;
use vgpu_vmm_testutils::vsock::{GuestOptions, TestGuest};
use vgpud::Daemon;

use crate::share::SPIN_PTX;
use crate::stats::spread_of;

/// Parameters.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Kernels per graph.
    pub kernels: usize,
    /// Repetitions (medians and spreads are reported).
    pub runs: usize,
    /// Batches (graph launches, or `kernels` launches) timed per run.
    pub batches: usize,
}

const VM: &str = "bench";
const GUEST_CID: u64 = 3;
/// Threads of one small kernel (one block).
const THREADS: u32 = 32;
/// Multiply-adds per thread: the kernel does almost nothing.
const SPIN_ITERS: u32 = 1;
const NS_PER_US: f64 = 1e3;
/// Kernels per branch of the fork/join case.
pub const BRANCH_KERNELS: usize = 4;
/// What one kernel of the fork/join case takes alone.
pub const BRANCH_KERNEL_TARGET: Duration = Duration::from_millis(5);
/// The fork/join case's kernels start at this many iterations before calibration.
const CALIBRATE_START_ITERS: u32 = 256;
/// Iterations of the loop case.
pub const LOOP_ITERATIONS: u32 = 200;
/// The loop case's kernels (`devices/ptx/fixtures/conditionals.cu`).
const CONDITIONALS_PTX: &str =
    include_str!("../../devices/ptx/fixtures/conditionals.compute_80.ptx");
/// The loop case's conditional handle (any value the graph declares).
const LOOP_HANDLE: u64 = 0x6770_0000_1000;

/// One run of the loop case, in nanoseconds per iteration.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Loop {
    /// Driven on the device by a while node.
    pub device: f64,
    /// Driven by the host: a launch and a synchronous read per iteration.
    pub host: f64,
}

/// One run of the fork/join case, in nanoseconds from launch to completion.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ForkJoin {
    /// The kernels in one chain.
    pub chain: f64,
    /// The same kernels in two independent branches.
    pub branches: f64,
}

/// Per-kernel times of one run, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// Issuing `kernels` launches, per kernel.
    pub launches_submit: f64,
    /// Issuing one graph launch, per kernel.
    pub graph_submit: f64,
    /// Launches and their completion, per kernel.
    pub launches_total: f64,
    /// A graph launch and its completion, per kernel.
    pub graph_total: f64,
}

/// A way of launching the kernels and the graph.
trait LaunchPath {
    /// Issues `kernels` launches.
    fn launches(&mut self) -> Result<(), String>;
    /// Issues one launch of the graph.
    fn graph(&mut self) -> Result<(), String>;
    /// Waits for the work issued.
    fn sync(&mut self) -> Result<(), String>;
}

fn sample(p: &mut dyn LaunchPath, kernels: usize, batches: usize) -> Result<Sample, String> {
    let per = (kernels * batches) as f64;
    let mut time = |graph: bool| -> Result<(f64, f64), String> {
        p.sync()?;
        let mut submit = 0.0;
        let t = Instant::now();
        for _ in 0..batches {
            let s = Instant::now();
            if graph {
                p.graph()?;
            } else {
                p.launches()?;
            }
            submit += s.elapsed().as_nanos() as f64;
        }
        p.sync()?;
        Ok((submit / per, t.elapsed().as_nanos() as f64 / per))
    };
    let (launches_submit, launches_total) = time(false)?;
    let (graph_submit, graph_total) = time(true)?;
    Ok(Sample {
        launches_submit,
        graph_submit,
        launches_total,
        graph_total,
    })
}

fn err(what: &str) -> impl FnOnce(cuda::client::CallError) -> String + '_ {
    move |e| format!("{what}: {} ({})", e.message, e.code)
}

/// The shim's protocol client with a kernel and an uploaded graph of it.
struct Remote {
    client: Client,
    ctx: u64,
    launch: msg::LaunchKernel,
    params: Vec<u8>,
    /// Where the iteration count sits in `params`.
    iters_at: usize,
    kernels: usize,
    exec: u64,
}

impl Remote {
    fn open(stream: Box<dyn cuda::transport::Stream>, kernels: usize) -> Result<Remote, String> {
        let mut client = Client::new(stream);
        client.hello("vgpu-bench").map_err(err("handshake"))?;
        let ctx = client
            .call(
                &msg::CtxCreate {
                    device: 0,
                    flags: 0,
                },
                &[],
            )
            .map_err(err("CtxCreate"))?
            .0
            .handle;
        let out = client
            .call(
                &msg::MemAlloc {
                    ctx,
                    size: u64::from(THREADS) * 4,
                },
                &[],
            )
            .map_err(err("MemAlloc"))?
            .0
            .ptr;
        let module = client
            .call(&msg::ModuleLoad { ctx }, SPIN_PTX.as_bytes())
            .map_err(err("ModuleLoad"))?
            .0
            .handle;
        let f = client
            .call(
                &msg::ModuleGetFunction {
                    ctx,
                    module,
                    name: "spin".into(),
                },
                &[],
            )
            .map_err(err("ModuleGetFunction"))?
            .0;
        let mut params = vec![0u8; 12];
        params[f.param_offsets[0] as usize..][..8].copy_from_slice(&out.to_le_bytes());
        params[f.param_offsets[1] as usize..][..4].copy_from_slice(&SPIN_ITERS.to_le_bytes());
        let launch = msg::LaunchKernel {
            ctx,
            stream: 0,
            function: f.function,
            grid_x: 1,
            grid_y: 1,
            grid_z: 1,
            block_x: THREADS,
            block_y: 1,
            block_z: 1,
            shared_bytes: 0,
        };
        let mut nodes = Vec::new();
        for _ in 0..kernels {
            push_op(&mut nodes, &launch, &params);
        }
        let exec = client
            .call(&msg::GraphInstantiate { ctx, replace: 0 }, &nodes)
            .map_err(err("GraphInstantiate"))?
            .0
            .handle;
        Ok(Remote {
            client,
            ctx,
            launch,
            params,
            iters_at: f.param_offsets[1] as usize,
            kernels,
            exec,
        })
    }
}

impl Remote {
    /// The kernel's launch and parameters for `iters` iterations per thread.
    fn spin(&self, iters: u32) -> Vec<u8> {
        let mut params = self.params.clone();
        params[self.iters_at..][..4].copy_from_slice(&iters.to_le_bytes());
        params
    }

    /// Runs graph `exec` and waits for it; its time in nanoseconds.
    fn run(&mut self, exec: u64) -> Result<f64, String> {
        self.sync()?;
        let t = Instant::now();
        let l = msg::GraphLaunch {
            ctx: self.ctx,
            stream: 0,
            exec,
        };
        self.client.post(&l, &[]).map_err(err("GraphLaunch"))?;
        self.sync()?;
        Ok(t.elapsed().as_nanos() as f64)
    }

    fn upload(&mut self, nodes: &[u8]) -> Result<u64, String> {
        let ctx = self.ctx;
        Ok(self
            .client
            .call(&msg::GraphInstantiate { ctx, replace: 0 }, nodes)
            .map_err(err("GraphInstantiate"))?
            .0
            .handle)
    }

    /// Uploads the fork/join case's graphs: (one chain, two branches).
    fn fork_join_graphs(&mut self) -> Result<(u64, u64), String> {
        // Iterations for a kernel of about BRANCH_KERNEL_TARGET.
        let mut iters = CALIBRATE_START_ITERS;
        loop {
            let mut one = Vec::new();
            push_op(&mut one, &self.launch, &self.spin(iters));
            let exec = self.upload(&one)?;
            let t = Duration::from_nanos(self.run(exec)? as u64);
            self.client
                .call(
                    &msg::GraphExecDestroy {
                        ctx: self.ctx,
                        exec,
                    },
                    &[],
                )
                .map_err(err("GraphExecDestroy"))?;
            if t >= BRANCH_KERNEL_TARGET / 4 || iters >= u32::MAX / 8 {
                let scale = BRANCH_KERNEL_TARGET.as_secs_f64() / t.as_secs_f64().max(1e-6);
                iters = ((f64::from(iters) * scale) as u32).max(1);
                break;
            }
            iters *= 4;
        }
        let params = self.spin(iters);
        let mut chain = Vec::new();
        let mut branches = Vec::new();
        for i in 0..2 * BRANCH_KERNELS {
            push_op(&mut chain, &self.launch, &params);
            if i == BRANCH_KERNELS {
                // The second branch starts with a root of its own.
                push_deps(&mut branches, &[]);
            }
            push_op(&mut branches, &self.launch, &params);
        }
        Ok((self.upload(&chain)?, self.upload(&branches)?))
    }
}

/// The loop case on one connection: the counter, the kernels and the uploaded while loop.
struct LoopCase {
    counter: u64,
    add_one: msg::LaunchKernel,
    add_one_params: Vec<u8>,
    exec: u64,
}

impl Remote {
    /// Loads the loop case's kernels and uploads its while loop.
    fn loop_case(&mut self) -> Result<LoopCase, String> {
        let ctx = self.ctx;
        let counter = self
            .client
            .call(&msg::MemAlloc { ctx, size: 4 }, &[])
            .map_err(err("MemAlloc"))?
            .0
            .ptr;
        let module = self
            .client
            .call(&msg::ModuleLoad { ctx }, CONDITIONALS_PTX.as_bytes())
            .map_err(err("ModuleLoad"))?
            .0
            .handle;
        let mut kernel = |name: &str, args: &[&[u8]]| -> Result<_, String> {
            let f = self
                .client
                .call(
                    &msg::ModuleGetFunction {
                        ctx,
                        module,
                        name: name.into(),
                    },
                    &[],
                )
                .map_err(err("ModuleGetFunction"))?
                .0;
            let mut params = Vec::new();
            for (a, &off) in args.iter().zip(&f.param_offsets) {
                let off = off as usize;
                params.resize(params.len().max(off + a.len()), 0);
                params[off..off + a.len()].copy_from_slice(a);
            }
            let launch = msg::LaunchKernel {
                function: f.function,
                block_x: 1,
                ..self.launch.clone()
            };
            Ok((launch, params))
        };
        let (count_down, count_down_params) = kernel(
            "count_down",
            &[&counter.to_le_bytes(), &LOOP_HANDLE.to_le_bytes()],
        )?;
        let (add_one, add_one_params) = kernel("add_one", &[&counter.to_le_bytes()])?;
        let mut body = Vec::new();
        push_op(&mut body, &count_down, &count_down_params);
        let mut bodies = Vec::new();
        push_body(&mut bodies, &body);
        let mut nodes = Vec::new();
        push_node(
            &mut nodes,
            CONDITIONAL_NODE,
            &msg::GraphConditionalNode {
                handle: LOOP_HANDLE,
                kind: conditional::WHILE,
                bodies: 1,
                default: 1,
                flags: conditional::ASSIGN_DEFAULT,
            },
            &bodies,
        );
        let exec = self.upload(&nodes)?;
        Ok(LoopCase {
            counter,
            add_one,
            add_one_params,
            exec,
        })
    }

    fn write_counter(&mut self, c: &LoopCase, value: u32) -> Result<(), String> {
        let m = msg::MemcpyHtoD {
            ctx: self.ctx,
            stream: 0,
            dst: c.counter,
        };
        self.client
            .call(&m, &value.to_le_bytes())
            .map_err(err("MemcpyHtoD"))
            .map(drop)
    }

    fn read_counter(&mut self, c: &LoopCase) -> Result<u32, String> {
        let m = msg::MemcpyDtoH {
            ctx: self.ctx,
            stream: 0,
            src: c.counter,
            len: 4,
        };
        let (_, bytes) = self.client.call(&m, &[]).map_err(err("MemcpyDtoH"))?;
        let b: [u8; 4] = bytes
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .ok_or("MemcpyDtoH: short reply")?;
        Ok(u32::from_le_bytes(b))
    }

    /// One run of the loop case: (device, host), nanoseconds per iteration.
    fn run_loop(&mut self, c: &LoopCase) -> Result<Loop, String> {
        self.write_counter(c, LOOP_ITERATIONS)?;
        let device = self.run(c.exec)?;
        let left = self.read_counter(c)?;
        if left != 0 {
            return Err(format!("the device's loop left {left} iterations"));
        }
        let t = Instant::now();
        let mut done = 0;
        while done < LOOP_ITERATIONS {
            self.client
                .post(&c.add_one, &c.add_one_params)
                .map_err(err("LaunchKernel"))?;
            done = self.read_counter(c)?;
        }
        let host = t.elapsed().as_nanos() as f64;
        let per = f64::from(LOOP_ITERATIONS);
        Ok(Loop {
            device: device / per,
            host: host / per,
        })
    }
}

impl LaunchPath for Remote {
    fn launches(&mut self) -> Result<(), String> {
        for _ in 0..self.kernels {
            self.client
                .post(&self.launch, &self.params)
                .map_err(err("LaunchKernel"))?;
        }
        self.client.flush().map_err(err("flush"))
    }

    fn graph(&mut self) -> Result<(), String> {
        let l = msg::GraphLaunch {
            ctx: self.ctx,
            stream: 0,
            exec: self.exec,
        };
        self.client.post(&l, &[]).map_err(err("GraphLaunch"))?;
        self.client.flush().map_err(err("flush"))
    }

    fn sync(&mut self) -> Result<(), String> {
        self.client
            .call(&msg::CtxSynchronize { ctx: self.ctx }, &[])
            .map_err(err("CtxSynchronize"))
            .map(drop)
    }
}

/// The guest shim's C ABI in this process (over the unix socket `VGPU_TRANSPORT` names).
struct Shim {
    f: cuda::exports::CUhandle,
    stream: cuda::exports::CUhandle,
    out: u64,
    kernels: usize,
    exec: cuda::exports::CUhandle,
}

fn check(what: &str, r: u32) -> Result<(), String> {
    if r == 0 {
        Ok(())
    } else {
        Err(format!("{what} failed with CUresult {r}"))
    }
}

impl Shim {
    fn open(kernels: usize) -> Result<Shim, String> {
        use cuda::exports::*;
        use cuda::graph::api::*;
        use cuda::stream_capture::*;
        check("cuInit", cuInit(0))?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cuCtxCreate", unsafe { cuCtxCreate_v2(&mut ctx, 0, 0) })?;
        let ptx = std::ffi::CString::new(SPIN_PTX).map_err(|e| e.to_string())?;
        let mut module = std::ptr::null_mut();
        // SAFETY: a NUL-terminated image and a valid out-pointer.
        check("cuModuleLoadData", unsafe {
            cuModuleLoadData(&mut module, ptx.as_ptr().cast())
        })?;
        let mut f = std::ptr::null_mut();
        // SAFETY: valid out-pointer and name.
        check("cuModuleGetFunction", unsafe {
            cuModuleGetFunction(&mut f, module, c"spin".as_ptr())
        })?;
        let mut out = 0u64;
        // SAFETY: valid out-pointer.
        check("cuMemAlloc", unsafe {
            cuMemAlloc_v2(&mut out, THREADS as usize * 4)
        })?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; CU_STREAM_NON_BLOCKING.
        check("cuStreamCreate", unsafe { cuStreamCreate(&mut stream, 1) })?;
        let mut shim = Shim {
            f,
            stream,
            out,
            kernels,
            exec: std::ptr::null_mut(),
        };
        check("cuStreamBeginCapture", cuStreamBeginCapture_v2(stream, 0))?;
        shim.launches()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cuStreamEndCapture", unsafe {
            cuStreamEndCapture(stream, &mut graph)
        })?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cuGraphInstantiate", unsafe {
            cuGraphInstantiateWithFlags(&mut exec, graph, 0)
        })?;
        check("cuGraphDestroy", cuGraphDestroy(graph))?;
        shim.exec = exec;
        Ok(shim)
    }
}

impl LaunchPath for Shim {
    fn launches(&mut self) -> Result<(), String> {
        let mut out = self.out;
        let mut iters = SPIN_ITERS;
        let mut args: [*mut std::ffi::c_void; 2] = [(&raw mut out).cast(), (&raw mut iters).cast()];
        for _ in 0..self.kernels {
            // SAFETY: the kernel's two parameters, valid for the call.
            let r = unsafe {
                cuda::exports::cuLaunchKernel(
                    self.f,
                    1,
                    1,
                    1,
                    THREADS,
                    1,
                    1,
                    0,
                    self.stream,
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            check("cuLaunchKernel", r)?;
        }
        Ok(())
    }

    fn graph(&mut self) -> Result<(), String> {
        check(
            "cuGraphLaunch",
            cuda::graph::api::cuGraphLaunch(self.exec, self.stream),
        )
    }

    fn sync(&mut self) -> Result<(), String> {
        check(
            "cuStreamSynchronize",
            cuda::exports::cuStreamSynchronize(self.stream),
        )
    }
}

fn config(dir: &Path) -> Result<Config, String> {
    let text = format!(
        "[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\n\n\
         [[vm]]\nname = \"{VM}\"\nmemory = \"256MiB\"\n\
         unix_socket = \"{}\"\nvhost_user_socket = \"{}\"\nguest_cid = {GUEST_CID}\n",
        dir.join("bench.sock").display(),
        dir.join("bench.vhost.sock").display(),
    );
    Config::parse(&dir.join("bench.toml"), &text).map_err(|e| format!("benchmark config: {e}"))
}

/// Every path's samples, one per run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// (path name, samples).
    pub paths: Vec<(&'static str, Vec<Sample>)>,
    /// The fork/join case, one per run.
    pub fork_join: Vec<ForkJoin>,
    /// The loop case per connection: (path name, one per run).
    pub loops: Vec<(&'static str, Vec<Loop>)>,
}

/// Measures every path `runs` times and returns the samples.
pub fn measure(p: Params) -> Result<Report, String> {
    if p.kernels == 0 || p.runs == 0 || p.batches == 0 {
        return Err("--kernels, --runs and --batches must be at least 1".into());
    }
    let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    let config = config(dir.path())?;
    let daemon = Daemon::start(&config).map_err(|e| format!("starting vgpud in-process: {e}"))?;
    // SAFETY: set before the shim reads it, before this process's other threads use the
    // environment.
    unsafe {
        std::env::set_var(
            "VGPU_TRANSPORT",
            format!("unix:{}", dir.path().join("bench.sock").display()),
        )
    };
    let mut shim = Shim::open(p.kernels)?;
    // As the shim connects (its reads poll briefly before they block).
    let unix = cuda::transport::connect(&cuda::transport::Endpoint::Unix(
        dir.path().join("bench.sock"),
    ))
    .map_err(|e| format!("connecting to the unix socket: {e}"))?;
    let mut unix = Remote::open(unix, p.kernels)?;
    let guest = TestGuest::start(
        &dir.path().join("bench.vhost.sock"),
        GuestOptions {
            busy_poll: true,
            ..GuestOptions::default()
        },
    )
    .map_err(|e| format!("attaching the in-process vhost-user frontend: {e}"))?;
    let stream = guest
        .connect(vgpu_proto::GPU_VSOCK_PORT)
        .map_err(|e| format!("connecting to the GPU port over vsock: {e}"))?;
    let mut vhost = Remote::open(Box::new(stream), p.kernels)?;

    let mut report = Report {
        paths: vec![
            ("shim, unix socket", Vec::new()),
            ("client, unix socket", Vec::new()),
            ("client, vhost-user vsock", Vec::new()),
        ],
        fork_join: Vec::new(),
        loops: vec![
            ("client, unix socket", Vec::new()),
            ("client, vhost-user vsock", Vec::new()),
        ],
    };
    let (chain, branches) = unix.fork_join_graphs()?;
    let unix_loop = unix.loop_case()?;
    let vhost_loop = vhost.loop_case()?;
    // Warm-up, then interleaved runs so that load on the machine hits every path alike.
    for path in [&mut shim as &mut dyn LaunchPath, &mut unix, &mut vhost] {
        sample(path, p.kernels, 1)?;
    }
    for _ in 0..p.runs {
        let paths: [&mut dyn LaunchPath; 3] = [&mut shim, &mut unix, &mut vhost];
        for (i, path) in paths.into_iter().enumerate() {
            report.paths[i].1.push(sample(path, p.kernels, p.batches)?);
        }
        report.fork_join.push(ForkJoin {
            chain: unix.run(chain)?,
            branches: unix.run(branches)?,
        });
        report.loops[0].1.push(unix.run_loop(&unix_loop)?);
        report.loops[1].1.push(vhost.run_loop(&vhost_loop)?);
    }
    drop(vhost);
    drop(guest);
    drop(unix);
    daemon.shutdown();
    Ok(report)
}

/// A table row: its figure's name, and the figure for launches and for the graph.
type Row = (&'static str, fn(&Sample) -> f64, fn(&Sample) -> f64);

fn print(p: Params, r: &Report) {
    println!(
        "graphs: a graph of {} one-block kernels vs {} launches, {} batches x {} runs \
         (medians, [lowest-highest run]), per kernel, simulated GPU",
        p.kernels, p.kernels, p.batches, p.runs
    );
    println!(
        "{:<26} {:<11} {:>24} {:>24} {:>22}",
        "path", "figure", "launches", "graph", "graph/launches"
    );
    let rows: [Row; 2] = [
        ("submit", |s| s.launches_submit, |s| s.graph_submit),
        ("end to end", |s| s.launches_total, |s| s.graph_total),
    ];
    for (name, samples) in &r.paths {
        for (fig, l, g) in rows {
            let (lm, llo, lhi) = spread_of(samples, l);
            let (gm, glo, ghi) = spread_of(samples, g);
            let ratios: Vec<Sample> = samples
                .iter()
                .map(|s| Sample {
                    launches_submit: g(s) / l(s),
                    ..Sample::default()
                })
                .collect();
            let (rm, rlo, rhi) = spread_of(&ratios, |s| s.launches_submit);
            println!(
                "{name:<26} {fig:<11} {:>7.3}us [{:.3}-{:.3}] {:>7.3}us [{:.3}-{:.3}] {:>6.3}x [{:.3}-{:.3}]",
                lm / NS_PER_US,
                llo / NS_PER_US,
                lhi / NS_PER_US,
                gm / NS_PER_US,
                glo / NS_PER_US,
                ghi / NS_PER_US,
                rm,
                rlo,
                rhi
            );
        }
    }
}

fn print_fork_join(r: &Report) {
    const NS_PER_MS: f64 = 1e6;
    let (cm, clo, chi) = spread_of(&r.fork_join, |f| f.chain);
    let (bm, blo, bhi) = spread_of(&r.fork_join, |f| f.branches);
    let (rm, rlo, rhi) = spread_of(&r.fork_join, |f| f.branches / f.chain);
    println!(
        "fork/join (client, unix socket): {} kernels of ~{} ms in one chain {:.2}ms [{:.2}-{:.2}], \
         in two independent branches {:.2}ms [{:.2}-{:.2}], branches/chain {:.3}x [{:.3}-{:.3}]",
        2 * BRANCH_KERNELS,
        BRANCH_KERNEL_TARGET.as_millis(),
        cm / NS_PER_MS,
        clo / NS_PER_MS,
        chi / NS_PER_MS,
        bm / NS_PER_MS,
        blo / NS_PER_MS,
        bhi / NS_PER_MS,
        rm,
        rlo,
        rhi
    );
}

fn print_loops(r: &Report) {
    for (path, runs) in &r.loops {
        let (dm, dlo, dhi) = spread_of(runs, |l| l.device);
        let (hm, hlo, hhi) = spread_of(runs, |l| l.host);
        let (rm, rlo, rhi) = spread_of(runs, |l| l.device / l.host);
        println!(
            "loop ({path}): {LOOP_ITERATIONS} iterations of a one-thread kernel, per iteration: \
             a while node on the device {:.2}us [{:.2}-{:.2}], driven by the host {:.2}us \
             [{:.2}-{:.2}], device/host {:.3}x [{:.3}-{:.3}]",
            dm / NS_PER_US,
            dlo / NS_PER_US,
            dhi / NS_PER_US,
            hm / NS_PER_US,
            hlo / NS_PER_US,
            hhi / NS_PER_US,
            rm,
            rlo,
            rhi
        );
    }
}

/// Runs the benchmark, prints the figures with their ratios and returns them.
pub fn run(p: Params) -> Result<Report, String> {
    let report = measure(p)?;
    print(p, &report);
    print_fork_join(&report);
    print_loops(&report);
    Ok(report)
}
