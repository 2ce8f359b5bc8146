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
