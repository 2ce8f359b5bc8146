//! The `vprintf` rewrite run on the PTX interpreter (a faithful PTX executor; no GPU here):
//! rewritten modules print through the buffer what the interpreter's own `vprintf` prints.

use std::sync::Arc;

use vgpu_cuda::printf::{self, BUFFER_SIZE, BUFFER_SYMBOL, HEAD_SIZE, HEAD_SYMBOL};
use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

/// A loaded module with its globals in test memory.
struct Loaded {
    m: Module,
    mem: TestMemory,
    globals: Vec<u64>,
}

impl Loaded {
    fn new(text: &str) -> Loaded {
        let m = Module::load(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let mem = TestMemory::new();
        let globals = alloc_globals(&m, &mem);
        Loaded { m, mem, globals }
    }

    fn global(&self, name: &str) -> u64 {
        let i = self
            .m
            .globals()
            .iter()
            .position(|g| g.name == name)
            .unwrap();
        self.globals[i]
    }

    fn launch(&self, kernel: &str, cfg: &Config, args: &[Arg], out: Option<Arc<TestOutput>>) {
        let params = pack_params(self.m.kernel(kernel).unwrap(), args);
        let control = LaunchControl::new();
        control.set_output(out.map(|o| o as Arc<dyn DeviceOutput>));
        self.m
            .launch(&Launch {
                kernel,
                grid: cfg.grid,
                block: cfg.block,
                dynamic_shared: cfg.dynamic_shared,
                params: &params,
                globals: &self.globals,
                memory: &self.mem,
                start_block: 0,
                workers: cfg.workers,
                control: &control,
            })
            .unwrap_or_else(|f| panic!("{kernel}: {f}"));
    }

    /// What the executor does after a launch: read the head and the buffer, reset the head,
    /// deliver the records.
    fn take(&self, room: usize) -> String {
        let head = self.global(HEAD_SYMBOL);
        let used = u64::from_le_bytes(self.mem.read::<u8>(head, HEAD_SIZE).try_into().unwrap());
        let buf = self
            .mem
            .read::<u8>(self.global(BUFFER_SYMBOL), (used as usize).min(BUFFER_SIZE));
        self.mem.write(head, &[0u8; HEAD_SIZE]);
        let text = std::cell::RefCell::new(Vec::new());
        printf::deliver(
            &buf,
            &|| room.saturating_sub(text.borrow().len()),
            &mut |t| text.borrow_mut().extend_from_slice(t),
        );
        String::from_utf8(text.into_inner()).unwrap()
    }
}

/// The interpreter's own output for a launch of the unrewritten module.
fn native(
    text: &str,
    kernel: &str,
    cfg: &Config,
    args: &dyn Fn(&TestMemory) -> Vec<Arg>,
) -> String {
    let l = Loaded::new(text);
    let out = Arc::new(TestOutput::new(1 << 20));
    let a = args(&l.mem);
    l.launch(kernel, cfg, &a, Some(Arc::clone(&out)));
    out.stdout()
}

/// The output of the rewritten module, through the buffer; the interpreter's `vprintf` is
/// never called (no output is attached).
fn rewritten(
    text: &str,
    kernel: &str,
    cfg: &Config,
    args: &dyn Fn(&TestMemory) -> Vec<Arg>,
) -> String {
    let r = printf::rewrite(text).expect("the fixture declares vprintf");
    let l = Loaded::new(&r);
    let a = args(&l.mem);
    l.launch(kernel, cfg, &a, None);
    l.take(1 << 20)
}

fn sorted(s: &str) -> Vec<&str> {
    let mut v: Vec<&str> = s.lines().collect();
    v.sort_unstable();
    v
}

#[test]
fn fixtures_print_through_the_buffer_what_the_interpreter_prints() {
    for arch in ARCHS {
        let text = fixture("deviceio", arch);
        let formats = |mem: &TestMemory| {
            vec![
                Arg::U64(mem.alloc_from(b"str\0")),
                Arg::F32(9.87654),
                Arg::F64(6.02e23),
                Arg::I64(-1_234_567_890_123),
            ]
        };
        let want = native(&text, "formats", &Config::linear(1, 32), &formats);
        assert_eq!(
            want,
            "d=-7 u=42 x=0xbeef lld=-1234567890123 f=9.877 e=6.02e+23 g=6.02e+23 s=str c=Z p=%\n\
             returned 9\n"
        );
        let got = rewritten(&text, "formats", &Config::linear(1, 32), &formats);
        assert_eq!(got, want, "{arch}");

        let cfg = Config {
            workers: 3,
            ..Config::linear(4, 64)
        };
        let hello = |_: &TestMemory| vec![Arg::I32(1234)];
        let want = native(&text, "hello", &cfg, &hello);
        let got = rewritten(&text, "hello", &cfg, &hello);
        assert_eq!(sorted(&got), sorted(&want), "{arch}");
        assert_eq!(got.lines().count(), 4);

        let cfg = Config {
            workers: 2,
            ..Config::linear(3, 96)
        };
        let want = native(&text, "lanes", &cfg, &|_| vec![]);
        let got = rewritten(&text, "lanes", &cfg, &|_| vec![]);
        assert_eq!(sorted(&got), sorted(&want), "{arch}");
        assert_eq!(got.lines().count(), 3 * 96);
    }
}

/// A kernel that calls `vprintf(fmt, args)` with its parameters and stores what it returns.
const CALLER: &str = r#"
.version 6.0
.target sm_52
.address_size 64

.extern .func  (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;

.visible .entry call(.param .u64 f, .param .u64 a, .param .u64 r)
{
	.reg .b32 %r<2>;
	.reg .b64 %rd<4>;
	ld.param.u64 %rd1, [f];
	ld.param.u64 %rd2, [a];
	ld.param.u64 %rd3, [r];
	{
	.param .b64 param0;
	st.param.b64 [param0], %rd1;
	.param .b64 param1;
	st.param.b64 [param1], %rd2;
	.param .b32 retval0;
	call.uni (retval0), vprintf, (param0, param1);
	ld.param.b32 %r1, [retval0];
	}
	st.u32 [%rd3], %r1;
	ret;
}
"#;

/// An argument as nvcc packs it.
#[derive(Debug, Clone)]
enum A {
    I(i32),
    L(i64),
    D(f64),
    /// A string (placed in device memory); `None` is a NULL pointer.
    S(Option<Vec<u8>>),
}

/// Puts `fmt` and `args` in `mem`: (format address (0 for `None`), argument buffer address).
fn place(mem: &TestMemory, fmt: Option<&[u8]>, args: Option<&[A]>) -> (u64, u64) {
    let f = fmt.map_or(0, |f| {
        let mut z = f.to_vec();
        z.push(0);
        mem.alloc_from(&z)
    });
    let Some(args) = args else { return (f, 0) };
    let mut buf: Vec<u8> = Vec::new();
    for a in args {
        let (v, size) = match a {
            A::I(v) => (u64::from(*v as u32), 4),
            A::L(v) => (*v as u64, 8),
            A::D(v) => (v.to_bits(), 8),
            A::S(None) => (0, 8),
            A::S(Some(s)) => {
                let mut z = s.clone();
                z.push(0);
                (mem.alloc_from(&z), 8)
            }
        };
        buf.resize(buf.len().next_multiple_of(size), 0);
        buf.extend_from_slice(&v.to_le_bytes()[..size]);
    }
    buf.resize(buf.len().max(8), 0);
    (f, mem.alloc_from(&buf))
}

/// Runs `call` on the interpreter's own `vprintf` (`rewritten` false) or through the
/// rewrite: (text, return value).
fn call(rewritten: bool, fmt: Option<&[u8]>, args: Option<&[A]>) -> (String, i32) {
    let text = if rewritten {
        printf::rewrite(CALLER).unwrap()
    } else {
        CALLER.to_string()
    };
    let l = Loaded::new(&text);
    let (f, a) = place(&l.mem, fmt, args);
    let r = l.mem.alloc(4);
    let out = Arc::new(TestOutput::new(1 << 20));
    let cfg = Config::linear(1, 1);
    let params = [Arg::U64(f), Arg::U64(a), Arg::U64(r)];
    if rewritten {
        l.launch("call", &cfg, &params, None);
    } else {
        l.launch("call", &cfg, &params, Some(Arc::clone(&out)));
    }
    let ret = l.mem.read::<i32>(r, 1)[0];
    let text = if rewritten {
        l.take(1 << 20)
    } else {
        out.stdout()
    };
    (text, ret)
}

/// Both ways print the same text and return the same value.
fn same(fmt: &[u8], args: &[A]) {
    let want = call(false, Some(fmt), Some(args));
    let got = call(true, Some(fmt), Some(args));
    assert_eq!(got, want, "{:?} {args:?}", String::from_utf8_lossy(fmt));
}

#[test]
fn formats_behave_as_the_interpreter_prints_them() {
    use A::*;
    let s = |t: &str| S(Some(t.as_bytes().to_vec()));
    same(b"plain\n", &[]);
    same(b"100%% sure %d\n", &[I(5)]);
    same(
        b"%d %lld %s %c|%hhd %hd\n",
        &[
            I(-7),
            L(-1_234_567_890_123),
            s("str"),
            I(90),
            I(0x1ff),
            I(0x1ffff),
        ],
    );
    same(b"[%.3s] [%10s] [%-4s]\n", &[s("abcdef"), s("hi"), s("")]);
    same(b"%s %.3s %s|\n", &[S(None), S(None), s("after null")]);
    same(b"%d%n %d\n", &[I(1), L(0), I(2)]);
    same(
        b"%5.2f %e %g %a %p\n",
        &[D(2.71), D(6.02e23), D(1e-5), D(1.0), L(0x1234)],
    );
    same(b"%*d rest %d\n", &[I(3), I(4)]);
    same(b"%.*f rest\n", &[I(3), D(1.0)]);
    same(b"%5%| %y %d\n", &[I(9)]);
    same(
        b"%lhd %hld %zu %jd %td %qd %Lf\n",
        &[I(-1), L(-2), L(3), L(4), L(5), L(6), D(7.5)],
    );
    same(
        b"%#x %#o %+d % d %05d %-5d|\n",
        &[I(255), I(8), I(1), I(2), I(3), I(4)],
    );
    same(b"trailing %", &[]);
    same(b"trailing %-0", &[]);
    same(b"%s%s%s\n", &[s("a"), S(None), s("c")]);
}

#[test]
fn no_format_and_no_arguments() {
    // A NULL format: -1 and nothing printed.
    assert_eq!(call(true, None, None), (String::new(), -1));
    assert_eq!(call(true, None, None), call(false, None, None));
    // A NULL argument buffer: the text up to the first conversion that needs an argument.
    let want = call(false, Some(b"a %% b %d c %d"), None);
    assert_eq!(want.0, "a % b ");
    assert_eq!(call(true, Some(b"a %% b %d c %d"), None), want);
}

#[test]
fn at_most_32_arguments_are_carried() {
    let args: Vec<A> = (0..40).map(A::I).collect();
    let fmt: String = (0..40).map(|_| "%d,").collect();
    let (got, n) = call(true, Some(fmt.as_bytes()), Some(&args));
    // As printf.rs formats a buffer of the first 32 arguments.
    let buf: Vec<u8> = (0..32u32).flat_map(|i| i.to_le_bytes()).collect();
    let mut want = Vec::new();
    let mut a = vgpu_ptx::printf::BufferArgs::new(&buf, |_, _| Vec::new());
    let wn = vgpu_ptx::printf::format(fmt.as_bytes(), &mut a, &mut want, 1 << 20);
    assert_eq!((got.as_bytes(), n), (&want[..], wn));
    assert_eq!(n, 32);
}

#[test]
fn long_formats_and_strings_are_cut() {
    let long = vec![b'x'; 5000];
    let (got, _) = call(true, Some(&long), Some(&[]));
    assert_eq!(got.len(), printf::MAX_FORMAT);
    let (got, n) = call(true, Some(b"[%s]"), Some(&[A::S(Some(vec![b'y'; 3000]))]));
    assert_eq!(n, 1);
    assert_eq!(got.len(), printf::MAX_STRING + 2);
}

#[test]
fn a_full_buffer_drops_records_and_returns_minus_one() {
    let l = Loaded::new(&printf::rewrite(CALLER).unwrap());
    let (f, a) = place(&l.mem, Some(b"rec %d\n"), Some(&[A::I(1)]));
    let r = l.mem.alloc(4);
    let head = l.global(HEAD_SYMBOL);
    let params = [Arg::U64(f), Arg::U64(a), Arg::U64(r)];
    // A record here takes 16 + 4 + 7 bytes, 32 in all: two fit in the last 64 bytes.
    l.mem
        .write(head, &((BUFFER_SIZE - 64) as u64).to_le_bytes());
    let mut rets = Vec::new();
    for _ in 0..3 {
        l.launch("call", &Config::linear(1, 1), &params, None);
        rets.push(l.mem.read::<i32>(r, 1)[0]);
    }
    assert_eq!(rets, [1, 1, -1]);
    let used = u64::from_le_bytes(l.mem.read::<u8>(head, 8).try_into().unwrap());
    assert_eq!(
        used,
        BUFFER_SIZE as u64 + 32,
        "the failed reservation still counts"
    );
    // Delivered from the start of the buffer: nothing was written there, so nothing prints.
    assert_eq!(l.take(1 << 20), "");

    // A record straddling the end marks the end of the records.
    let buf = l.global(BUFFER_SYMBOL);
    l.mem.write(buf, &[0xabu8; 64]);
    l.mem
        .write(head, &((BUFFER_SIZE - 16) as u64).to_le_bytes());
    l.launch("call", &Config::linear(1, 1), &params, None);
    assert_eq!(l.mem.read::<i32>(r, 1)[0], -1);
    let end = l.mem.read::<u8>(buf + (BUFFER_SIZE - 16) as u64, 4);
    assert_eq!(end, [0, 0, 0, 0]);
}

#[test]
fn output_room_is_respected_record_by_record() {
    let text = fixture("deviceio", "compute_80");
    let l = Loaded::new(&printf::rewrite(&text).unwrap());
    l.launch("lanes", &Config::linear(1, 32), &[], None);
    // Room for 10 lines of "lane NN\n" and a bit: whole records only.
    let got = l.take(85);
    assert_eq!(got.len(), 80, "{got}");
    assert!(got.lines().all(|x| x.starts_with("lane ") && x.len() == 7));
}

#[test]
fn the_decoder_survives_garbage() {
    // A real buffer, then corrupted bytes and random buffers: never a panic.
    let text = fixture("deviceio", "compute_52");
    let l = Loaded::new(&printf::rewrite(&text).unwrap());
    let s = l.mem.alloc_from(b"str\0");
    l.launch(
        "formats",
        &Config::linear(1, 32),
        &[Arg::U64(s), Arg::F32(1.0), Arg::F64(2.0), Arg::I64(3)],
        None,
    );
    let head = u64::from_le_bytes(
        l.mem
            .read::<u8>(l.global(HEAD_SYMBOL), 8)
            .try_into()
            .unwrap(),
    );
    let real = l.mem.read::<u8>(l.global(BUFFER_SYMBOL), head as usize);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut sink = 0usize;
    for round in 0..3000 {
        let mut b = if round % 2 == 0 {
            real.clone()
        } else {
            (0..(rand() % 512) as usize).map(|_| rand() as u8).collect()
        };
        for _ in 0..(rand() % 8) {
            if b.is_empty() {
                break;
            }
            let at = (rand() % b.len() as u64) as usize;
            b[at] = match rand() % 4 {
                0 => 0,
                1 => 0xff,
                _ => rand() as u8,
            };
        }
        if round % 7 == 0 {
            b.truncate((rand() % (b.len() as u64 + 1)) as usize);
        }
        printf::deliver(&b, &|| 4096, &mut |t| sink += t.len());
    }
    assert!(sink > 0);
}
