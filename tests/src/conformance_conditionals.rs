//! Conditional graph nodes through the broker's protocol: if, if/else, while and switch nodes
//! whose bodies run as the launch's own kernels set their handles (`cudaGraphSetConditional`),
//! each launch starting from the handles' defaults; hostile uploads refused; a kernel that sets
//! a handle that is not its launch's, and a while loop that could never end, fail their own
//! context only. A device whose kernels cannot set handles (the real-GPU executor) refuses such
//! graphs at instantiation with `CUDA_ERROR_NOT_SUPPORTED`.

use vgpu_corpus::Arg;
use vgpu_proto::cuda;
use vgpu_proto::graph::{
    CONDITIONAL_NODE, MAX_CONDITIONAL_DEPTH, conditional, push_body, push_node, push_op,
};
use vgpu_proto::msg;

use crate::conformance::{Code, Kernel, Rig, Session, Target, code, one_thread, packed};

/// The kernels (`devices/ptx/fixtures/conditionals.cu`, compiled by NVRTC).
const CONDITIONALS_PTX: &str =
    include_str!("../../devices/ptx/fixtures/conditionals.compute_80.ptx");

const MIB: u64 = 1 << 20;
/// Handles as the shim makes them (any value the graph declares).
const H1: u64 = 0x6770_0000_1000;
const H2: u64 = 0x6770_0000_2000;

/// A one-thread launch of `k` as a graph node.
fn launch_node(s: &Session, k: &Kernel, args: &[Arg], out: &mut Vec<u8>) {
    push_op(out, &one_thread(s.ctx, k), &packed(k, args));
}

/// A conditional node on `handle` of `kind` with `bodies`; its start value `default` with
/// `ASSIGN_DEFAULT`.
fn conditional_node(
    handle: u64,
    kind: u32,
    default: Option<u32>,
    bodies: &[Vec<u8>],
    out: &mut Vec<u8>,
) {
    let mut tail = Vec::new();
    for b in bodies {
        push_body(&mut tail, b);
    }
    push_node(
        out,
        CONDITIONAL_NODE,
        &msg::GraphConditionalNode {
            handle,
            kind,
            bodies: bodies.len() as u32,
            default: default.unwrap_or(0),
            flags: if default.is_some() {
                conditional::ASSIGN_DEFAULT
            } else {
                0
            },
        },
        &tail,
    );
}

fn instantiate(s: &mut Session, nodes: &[u8]) -> Result<u64, Code> {
    let ctx = s.ctx;
    code(
        s.client
            .call(&msg::GraphInstantiate { ctx, replace: 0 }, nodes),
    )
    .map(|r| r.0.handle)
}

fn launch(s: &mut Session, exec: u64) -> Result<(), Code> {
    let ctx = s.ctx;
    code(s.client.call(
        &msg::GraphLaunch {
            ctx,
            stream: 0,
            exec,
        },
        &[],
    ))
    .map(drop)
}

fn read_i32s(s: &mut Session, p: u64, n: usize) -> Vec<i32> {
    s.dtoh(p, n * 4)
        .unwrap()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn write_i32s(s: &mut Session, p: u64, v: &[i32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    s.htod(p, &bytes).unwrap();
}

/// The check (see the module's doc).
pub fn graph_conditional_nodes(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 16 * MIB, 1), ("b", 16 * MIB, 1)]);
    let runs_conditionals = rig.device.info().kind == "sim";
    let mut s = rig.session("a");
    let m = s.load(CONDITIONALS_PTX.as_bytes()).unwrap();
    let (set, add, count_down) = (
        s.kernel(m, "set_handle").unwrap(),
        s.kernel(m, "add_one").unwrap(),
        s.kernel(m, "count_down").unwrap(),
    );
    let cells = s.alloc(64).unwrap();
    let cell = |i: u64| cells + 4 * i;

    // while (h1) { cells[0] += 1; h1 = --cells[3] > 0; }, starting true at every launch.
    let mut body = Vec::new();
    launch_node(&s, &add, &[Arg::Ptr(cell(0))], &mut body);
    launch_node(
        &s,
        &count_down,
        &[Arg::Ptr(cell(3)), Arg::U64(H1)],
        &mut body,
    );
    let mut looped = Vec::new();
    conditional_node(H1, conditional::WHILE, Some(1), &[body], &mut looped);
    let exec = instantiate(&mut s, &looped);
    if !runs_conditionals {
        assert_eq!(exec, Err(cuda::CUDA_ERROR_NOT_SUPPORTED), "{}", t.name);
        return;
    }
    let exec = exec.unwrap();
    write_i32s(&mut s, cells, &[0, 0, 0, 5]);
    launch(&mut s, exec).unwrap();
    s.sync().unwrap();
    assert_eq!(
        read_i32s(&mut s, cells, 4),
        vec![5, 0, 0, 0],
        "5 iterations"
    );
    // The next launch starts from the default again.
    write_i32s(&mut s, cell(3), &[3]);
    launch(&mut s, exec).unwrap();
    s.sync().unwrap();
    assert_eq!(read_i32s(&mut s, cells, 1), vec![8], "3 more iterations");

    // h2 = v; if (h2) { cells[0] += 1; cells[0] += 1 } else { cells[1] += 1 }; cells[2] += 1.
    let if_else = |s: &mut Session, value: u32| {
        let mut then = Vec::new();
        launch_node(s, &add, &[Arg::Ptr(cell(0))], &mut then);
        launch_node(s, &add, &[Arg::Ptr(cell(0))], &mut then);
        let mut other = Vec::new();
        launch_node(s, &add, &[Arg::Ptr(cell(1))], &mut other);
        let mut nodes = Vec::new();
        launch_node(s, &set, &[Arg::U64(H2), Arg::U32(value)], &mut nodes);
        conditional_node(H2, conditional::IF, None, &[then, other], &mut nodes);
        launch_node(s, &add, &[Arg::Ptr(cell(2))], &mut nodes);
        let exec = instantiate(s, &nodes).unwrap();
        write_i32s(s, cells, &[0; 4]);
        launch(s, exec).unwrap();
        s.sync().unwrap();
        read_i32s(s, cells, 3)
    };
    assert_eq!(if_else(&mut s, 7), vec![2, 0, 1], "the then body");
    assert_eq!(if_else(&mut s, 0), vec![0, 1, 1], "the else body");

    // A switch of three cases inside an if: case n adds one to cells[n].
    let switch = |s: &mut Session, value: u32| {
        let cases: Vec<Vec<u8>> = (0..3)
            .map(|i| {
                let mut c = Vec::new();
                launch_node(s, &add, &[Arg::Ptr(cell(i))], &mut c);
                c
            })
            .collect();
        let mut inner = Vec::new();
        launch_node(s, &set, &[Arg::U64(H2), Arg::U32(value)], &mut inner);
        conditional_node(H2, conditional::SWITCH, None, &cases, &mut inner);
        let mut nodes = Vec::new();
        conditional_node(H1, conditional::IF, Some(1), &[inner], &mut nodes);
        let exec = instantiate(s, &nodes).unwrap();
        write_i32s(s, cells, &[0; 4]);
        launch(s, exec).unwrap();
        s.sync().unwrap();
        read_i32s(s, cells, 3)
    };
    assert_eq!(switch(&mut s, 1), vec![0, 1, 0], "case 1");
    assert_eq!(switch(&mut s, 3), vec![0, 0, 0], "past the last case");

    // Hostile uploads.
    let refused = |s: &mut Session, nodes: &[u8], what: &str| {
        assert_eq!(
            instantiate(s, nodes),
            Err(cuda::CUDA_ERROR_INVALID_VALUE),
            "{what}"
        );
    };
    let mut one = Vec::new();
    launch_node(&s, &add, &[Arg::Ptr(cell(0))], &mut one);
    let mut bad = Vec::new();
    conditional_node(H1, 7, None, std::slice::from_ref(&one), &mut bad);
    refused(&mut s, &bad, "an unknown type");
    bad.clear();
    conditional_node(
        H1,
        conditional::WHILE,
        None,
        &[one.clone(), one.clone()],
        &mut bad,
    );
    refused(&mut s, &bad, "a while loop with two bodies");
    let mut record = Vec::new();
    push_op(
        &mut record,
        &msg::EventRecord {
            ctx: s.ctx,
            stream: 0,
            event: 0,
        },
        &[],
    );
    bad.clear();
    conditional_node(H1, conditional::IF, None, &[record], &mut bad);
    refused(&mut s, &bad, "an event record in a body");
    let mut deep = one.clone();
    for _ in 0..=MAX_CONDITIONAL_DEPTH {
        let mut outer = Vec::new();
        conditional_node(H1, conditional::IF, Some(1), &[deep], &mut outer);
        deep = outer;
    }
    refused(&mut s, &deep, "conditional nodes nested too deep");
    bad.clear();
    conditional_node(
        H1,
        conditional::IF,
        None,
        std::slice::from_ref(&one),
        &mut bad,
    );
    refused(&mut s, &bad[..bad.len() - 2], "a truncated body");
    bad.clear();
    conditional_node(
        H1,
        conditional::IF,
        Some(1),
        std::slice::from_ref(&one),
        &mut bad,
    );
    conditional_node(H1, conditional::IF, Some(0), &[one], &mut bad);
    refused(&mut s, &bad, "one handle with two defaults");

    // A while loop whose body launches no kernel could never end: it fails its context.
    let mut b = rig.session("b");
    let theirs = b.alloc(4).unwrap();
    let mut fill = Vec::new();
    push_op(
        &mut fill,
        &msg::Memset {
            ctx: b.ctx,
            stream: 0,
            dst: theirs,
            value: 0,
            elem_size: 4,
            count: 1,
        },
        &[],
    );
    let mut forever = Vec::new();
    conditional_node(H1, conditional::WHILE, Some(1), &[fill], &mut forever);
    let forever = instantiate(&mut b, &forever).unwrap();
    // Reported by the launch or by the next synchronization, as an asynchronous error is.
    let r = launch(&mut b, forever).and_then(|()| b.sync());
    assert_eq!(r, Err(cuda::CUDA_ERROR_LAUNCH_TIMEOUT));
    // A kernel that sets a handle its launch does not have fails with an illegal instruction,
    // in its own VM only.
    let mut b = rig.session("b");
    let mb = b.load(CONDITIONALS_PTX.as_bytes()).unwrap();
    let set_b = b.kernel(mb, "set_handle").unwrap();
    b.launch(&set_b, [1; 3], [1; 3], 0, &[Arg::U64(H1), Arg::U32(1)])
        .unwrap();
    assert_eq!(b.sync(), Err(cuda::CUDA_ERROR_ILLEGAL_INSTRUCTION));
    write_i32s(&mut s, cells, &[0, 0, 0, 3]);
    launch(&mut s, exec).unwrap();
    s.sync().unwrap();
    assert_eq!(
        read_i32s(&mut s, cells, 1),
        vec![3],
        "the other VM carries on"
    );
}
