//! Device-side `printf` on a real GPU, returned to the guest.
//!
//! NVIDIA's driver prints a kernel's `printf` text to the stdout of the process that owns the
//! context (vgpud), where no guest can see it. So vgpud does not let the driver's `vprintf`
//! run: when a PTX module declares `vprintf` (nvcc and NVRTC compile `printf(fmt, ...)` into
//! `vprintf(fmt, args)`), [`rewrite`] replaces that declaration by a buffer and a PTX
//! *definition* of `vprintf` with the same signature (call sites stay as they are):
//!
//! * `__vgpu_printf_head` (`.u64`): bytes reserved so far in the buffer;
//! * `__vgpu_printf_buf` ([`BUFFER_SIZE`] bytes, CUDA's default printf FIFO): records.
//!
//! The device function scans the format itself, with the parse rules of
//! [`vgpu_ptx::printf::format`], to learn how long the argument buffer is (the callee is not
//! told), reserves one record with an atomic add on the head, and copies into it the format
//! text, the argument bytes and the text of every non-NULL `%s` argument. It returns the number
//! of arguments, as CUDA's `printf` does, or -1 when the buffer is full (the record is dropped,
//! as CUDA drops output past its FIFO).
//!
//! After each launch of a kernel of such a module the executor reads the buffer back, resets
//! the head and formats the records on the host ([`deliver`]). Because a record carries the
//! format, the arguments *and* the strings, the host never reads device memory that a guest
//! pointer names. A `%s` pointer the guest's kernel cannot read faults that kernel (its own
//! launch, as on any GPU). Record layout, all little-endian, records 8-byte aligned:
//!
//! ```text
//! u32 total (bytes of the record, a multiple of 8)
//! u32 args_len, u32 fmt_len, u32 n_strings
//! args_len bytes of arguments (as the caller packed them; 8-byte aligned here)
//! fmt_len bytes of format text
//! at the next 4-byte boundary, n_strings times: u32 len, len bytes, padding to 4
//! ```

use std::fmt::Write as _;

use vgpu_ptx::printf::{self, BufferArgs};

/// Where a module's device `printf` records go ((this module)): device addresses of its
/// `__vgpu_printf_head` and `__vgpu_printf_buf` globals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrintfBuffer {
    /// The head counter (bytes reserved).
    pub head: u64,
    /// The buffer ([`BUFFER_SIZE`] bytes).
    pub buf: u64,
}

/// Size of a module's printf buffer: CUDA's default printf FIFO (1 MiB).
pub const BUFFER_SIZE: usize = 1 << 20;
/// Size of the head counter, in bytes.
pub const HEAD_SIZE: usize = 8;
/// Name of the head counter (a `.u64` module global).
pub const HEAD_SYMBOL: &str = "__vgpu_printf_head";
/// Name of the buffer (a module global of [`BUFFER_SIZE`] bytes).
pub const BUFFER_SYMBOL: &str = "__vgpu_printf_buf";
/// Longest format text a record carries; the rest of a longer format is not printed.
pub const MAX_FORMAT: usize = 4096;
/// Longest `%s` string a record carries.
pub const MAX_STRING: usize = 1024;
/// Most arguments a record carries (CUDA's limit); conversions past them print nothing more.
pub const MAX_ARGS: usize = printf::MAX_ARGS;
/// Bytes of a record's header.
const HEADER: usize = 16;

/// Names of the generated function's parameters.
const RET: &str = "__vgpu_printf_ret";
const FMT: &str = "__vgpu_printf_fmt";
const ARGS: &str = "__vgpu_printf_args";

/// A token of PTX text with its byte span.
#[derive(Debug, Clone, Copy)]
struct Token<'a> {
    start: usize,
    end: usize,
    text: &'a str,
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'%' | b'.')
}

/// Tokens of PTX text, without comments and string literals.
fn tokens(text: &str) -> Vec<Token<'_>> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if b[i..].starts_with(b"//") {
            i = b[i..]
                .iter()
                .position(|&x| x == b'\n')
                .map_or(b.len(), |p| i + p);
        } else if b[i..].starts_with(b"/*") {
            i = text[i + 2..].find("*/").map_or(b.len(), |p| i + 2 + p + 2);
        } else if c == b'"' {
            i = b[i + 1..]
                .iter()
                .position(|&x| x == b'"')
                .map_or(b.len(), |p| i + 1 + p + 1);
        } else if is_word_byte(c) {
            let start = i;
            while i < b.len() && is_word_byte(b[i]) {
                i += 1;
            }
            out.push(Token {
                start,
                end: i,
                text: &text[start..i],
            });
        } else {
            // One punctuation character (the text is UTF-8: step over a whole character).
            let len = text[i..].chars().next().map_or(1, char::len_utf8);
            out.push(Token {
                start: i,
                end: i + len,
                text: &text[i..i + len],
            });
            i += len;
        }
    }
    out
}

/// The index of the `)` closing the `(` at `open`.
fn closing(t: &[Token<'_>], open: usize) -> Option<usize> {
    (open + 1..t.len())
        .find(|&k| t[k].text == ")" || t[k].text == "(")
        .filter(|&k| t[k].text == ")")
}

/// A `vprintf` declaration found in PTX text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Declaration {
    /// Byte span of the whole declaration, `.extern` to `;`.
    start: usize,
    end: usize,
    /// Whether it declares the `.b32` return value.
    returns: bool,
}

/// Finds `.extern .func [(.param .b32 R)] vprintf(.param .b64 A, .param .b64 B);`.
fn find_declaration(text: &str) -> Option<Declaration> {
    let t = tokens(text);
    let is_word = |k: usize, w: &str| t.get(k).is_some_and(|x| x.text == w);
    for i in 0..t.len() {
        if !is_word(i, ".extern") || !is_word(i + 1, ".func") {
            continue;
        }
        let mut j = i + 2;
        let mut returns = false;
        if is_word(j, "(") {
            let Some(k) = closing(&t, j) else { continue };
            let ret: Vec<&str> = t[j + 1..k].iter().map(|x| x.text).collect();
            if !matches!(ret.as_slice(), [".param", ".b32" | ".u32" | ".s32", _]) {
                continue;
            }
            returns = true;
            j = k + 1;
        }
        if !is_word(j, "vprintf") || !is_word(j + 1, "(") {
            continue;
        }
        let Some(k) = closing(&t, j + 1) else {
            continue;
        };
        let formals: Vec<&str> = t[j + 2..k].iter().map(|x| x.text).collect();
        let b64 = |s: &str| matches!(s, ".b64" | ".u64" | ".s64");
        let two = match formals.as_slice() {
            [".param", a, _, ",", ".param", b, _] => b64(a) && b64(b),
            _ => false,
        };
        if !two || !is_word(k + 1, ";") {
            continue;
        }
        return Some(Declaration {
            start: t[i].start,
            end: t[k + 1].end,
            returns,
        });
    }
    None
}

/// Whether PTX text declares `vprintf` the way nvcc does (and so calls it).
pub fn declares_vprintf(text: &str) -> bool {
    find_declaration(text).is_some()
}

/// `text` with its `vprintf` declaration replaced by the printf buffer and a definition of
/// `vprintf` that writes into it; `None` when it declares no `vprintf`.
pub fn rewrite(text: &str) -> Option<String> {
    let d = find_declaration(text)?;
    let mut out = String::with_capacity(text.len() + 8192);
    out.push_str(&text[..d.start]);
    out.push_str(&definition(d.returns));
    out.push_str(&text[d.end..]);
    Some(out)
}

/// PTX text written line by line, with fresh labels.
struct Ptx {
    text: String,
    labels: u32,
}

impl Ptx {
    fn line(&mut self, s: &str) {
        self.text.push('\t');
        self.text.push_str(s);
        self.text.push('\n');
    }

    fn label(&mut self) -> String {
        self.labels += 1;
        format!("$L__vgpu_printf_{}", self.labels)
    }

    fn place(&mut self, label: &str) {
        let _ = writeln!(self.text, "{label}:");
    }

    /// `%c = i < flen ? sf[i] : 0` (the format as the scan sees it, cut at `flen`).
    fn peek(&mut self) {
        self.line("mov.u32 %vc, 0;");
        self.line("setp.lt.u32 %vq, %vi, %vflen;");
        self.line("cvt.u64.u32 %va, %vi;");
        self.line("add.u64 %va, %vsf, %va;");
        self.line("@%vq ld.u8 %vc, [%va];");
    }

    /// Branches to `to` when `%vc` is one of `chars`.
    fn branch_if_any(&mut self, chars: &[u8], to: &str) {
        for &c in chars {
            self.line(&format!("setp.eq.u32 %vp, %vc, {c};"));
            self.line(&format!("@%vp bra {to};"));
        }
    }

    /// Copies `len` (a `.u32` register) bytes from generic address `src` to global address
    /// `dst` (`.u64` registers), one byte at a time (neither side need be aligned).
    fn copy_bytes(&mut self, src: &str, dst: &str, len: &str) {
        let (top, done) = (self.label(), self.label());
        self.line("mov.u32 %vk, 0;");
        self.place(&top);
        self.line(&format!("setp.ge.u32 %vp, %vk, {len};"));
        self.line(&format!("@%vp bra {done};"));
        self.line("cvt.u64.u32 %vb, %vk;");
        self.line(&format!("add.u64 %va, {src}, %vb;"));
        self.line("ld.u8 %vt, [%va];");
        self.line(&format!("add.u64 %va, {dst}, %vb;"));
        self.line("st.global.u8 [%va], %vt;");
        self.line("add.u32 %vk, %vk, 1;");
        self.line(&format!("bra {top};"));
        self.place(&done);
    }

    /// `%vk` = length of the NUL-terminated string at generic `%vs`, at most `max` (a register
    /// or a constant); with `dst`, copies its bytes to global address `dst + k` on the way.
    fn strlen(&mut self, max: &str, dst: Option<&str>) {
        let (top, done) = (self.label(), self.label());
        self.line("mov.u32 %vk, 0;");
        self.place(&top);
        self.line(&format!("setp.ge.u32 %vp, %vk, {max};"));
        self.line(&format!("@%vp bra {done};"));
        self.line("cvt.u64.u32 %vb, %vk;");
        self.line("add.u64 %va, %vs, %vb;");
        self.line("ld.u8 %vt, [%va];");
        self.line("setp.eq.u32 %vp, %vt, 0;");
        self.line(&format!("@%vp bra {done};"));
        if let Some(dst) = dst {
            self.line(&format!("add.u64 %va, {dst}, %vb;"));
            self.line("st.global.u8 [%va], %vt;");
        }
        self.line("add.u32 %vk, %vk, 1;");
        self.line(&format!("bra {top};"));
        self.place(&done);
    }
}

/// The printf buffer and the PTX definition of `vprintf` (with or without its return value).
///
/// Registers: `%vfmt %vargs` the caller's pointers; `%vsf %vsa` the format and arguments the
/// scan reads (the caller's in pass 1, the record's copies in pass 2); `%vflen %valen` their
/// lengths; `%valim` the most argument bytes the scan may use; `%vi` the format index; `%vn`
/// arguments found; `%vstot` bytes of strings (pass 1); `%vrec` the record (global address);
/// `%vwoff` where the next string goes in it (pass 2); `%vnstr` strings written.
fn definition(returns: bool) -> String {
    let mut p = Ptx {
        text: String::with_capacity(16 << 10),
        labels: 0,
    };
    let _ = writeln!(p.text, ".visible .global .align 8 .u64 {HEAD_SYMBOL};");
    let _ = writeln!(
        p.text,
        ".visible .global .align 8 .b8 {BUFFER_SYMBOL}[{BUFFER_SIZE}];"
    );
    let ret = if returns {
        format!("(.param .b32 {RET}) ")
    } else {
        String::new()
    };
    let _ = writeln!(
        p.text,
        ".func {ret}vprintf(.param .b64 {FMT}, .param .b64 {ARGS})\n{{"
    );
    p.line(".reg .pred %vp, %vq, %vpass2, %vstop, %vlong, %vstr;");
    p.line(
        ".reg .b32 %vc, %vt, %vi, %vk, %vn, %vflen, %valen, %valim, %vsize, %voff, %vstot, \
         %vtotal, %vwoff, %vnstr, %vcap;",
    );
    p.line(".reg .b64 %vfmt, %vargs, %vsf, %vsa, %va, %vb, %vs, %vrec, %vstart, %vend;");
    let (fail, scan, next, end, star, stop) = (
        p.label(),
        p.label(),
        p.label(),
        p.label(),
        p.label(),
        p.label(),
    );
    p.line(&format!("ld.param.u64 %vfmt, [{FMT}];"));
    p.line(&format!("ld.param.u64 %vargs, [{ARGS}];"));
    p.line("setp.eq.u64 %vp, %vfmt, 0;");
    p.line(&format!("@%vp bra {fail};"));

    // The format's length, at most MAX_FORMAT.
    p.line("mov.u64 %vs, %vfmt;");
    p.strlen(&MAX_FORMAT.to_string(), None);
    p.line("mov.u32 %vflen, %vk;");

    // Pass 1 reads the caller's format and arguments (none when `args` is NULL).
    p.line("mov.u64 %vsf, %vfmt;");
    p.line("mov.u64 %vsa, %vargs;");
    p.line("mov.u32 %valim, -1;");
    p.line("setp.eq.u64 %vp, %vargs, 0;");
    p.line("@%vp mov.u32 %valim, 0;");
    p.line("mov.u32 %vstot, 0;");
    p.line("mov.u32 %vt, 0;");
    p.line("setp.ne.u32 %vpass2, %vt, 0;");

    // The scan: printf.rs's parse, counting the arguments each conversion takes.
    p.place(&scan);
    p.line("mov.u32 %vi, 0;");
    p.line("mov.u32 %valen, 0;");
    p.line("mov.u32 %vn, 0;");
    p.line("mov.u32 %vt, 0;");
    p.line("setp.ne.u32 %vstop, %vt, 0;");
    p.place(&next);
    p.line("setp.ge.u32 %vp, %vi, %vflen;");
    p.line(&format!("@%vp bra {end};"));
    p.peek();
    p.line("add.u32 %vi, %vi, 1;");
    p.line("setp.ne.u32 %vp, %vc, 37;"); // '%'
    p.line(&format!("@%vp bra {next};"));
    // Past a `*` or the last argument the rest of the format is only measured.
    p.line(&format!("@%vstop bra {next};"));
    // Flags.
    let (flags, width, prec, prec_digits, len, len_loop, long, short, conv) = (
        p.label(),
        p.label(),
        p.label(),
        p.label(),
        p.label(),
        p.label(),
        p.label(),
        p.label(),
        p.label(),
    );
    let flag_next = p.label();
    p.place(&flags);
    p.peek();
    p.branch_if_any(b"-+ #0", &flag_next);
    p.line(&format!("bra {width};"));
    p.place(&flag_next);
    p.line("add.u32 %vi, %vi, 1;");
    p.line(&format!("bra {flags};"));
    // Width digits.
    p.place(&width);
    p.peek();
    p.line("sub.u32 %vt, %vc, 48;");
    p.line("setp.lt.u32 %vp, %vt, 10;");
    p.line("@%vp add.u32 %vi, %vi, 1;");
    p.line(&format!("@%vp bra {width};"));
    p.branch_if_any(b"*", &star);
    p.line("setp.ne.u32 %vp, %vc, 46;"); // '.'
    p.line(&format!("@%vp bra {len};"));
    p.place(&prec);
    p.line("add.u32 %vi, %vi, 1;");
    p.peek();
    p.branch_if_any(b"*", &star);
    p.place(&prec_digits);
    p.peek();
    p.line("sub.u32 %vt, %vc, 48;");
    p.line("setp.lt.u32 %vp, %vt, 10;");
    p.line("@%vp add.u32 %vi, %vi, 1;");
    p.line(&format!("@%vp bra {prec_digits};"));
    p.line(&format!("bra {len};"));
    // `*`: CUDA does not support it; the host prints the rest as it stands.
    p.place(&star);
    p.place(&stop);
    p.line("mov.u32 %vt, 1;");
    p.line("setp.ne.u32 %vstop, %vt, 0;");
    p.line(&format!("bra {next};"));
    // Length modifiers: the last one decides (h: 4 bytes, any other: 8).
    p.place(&len);
    p.line("mov.u32 %vt, 0;");
    p.line("setp.ne.u32 %vlong, %vt, 0;");
    p.place(&len_loop);
    p.peek();
    p.branch_if_any(b"h", &short);
    p.branch_if_any(b"ljztqL", &long);
    p.line(&format!("bra {conv};"));
    p.place(&short);
    p.line("mov.u32 %vt, 0;");
    p.line("setp.ne.u32 %vlong, %vt, 0;");
    p.line("add.u32 %vi, %vi, 1;");
    p.line(&format!("bra {len_loop};"));
    p.place(&long);
    p.line("mov.u32 %vt, 1;");
    p.line("setp.ne.u32 %vlong, %vt, 0;");
    p.line("add.u32 %vi, %vi, 1;");
    p.line(&format!("bra {len_loop};"));
    // The conversion: how many bytes of arguments it takes.
    p.place(&conv);
    p.line("setp.ge.u32 %vp, %vi, %vflen;");
    p.line(&format!("@%vp bra {stop};")); // a `%` at the end: printed as it stands
    p.line("add.u32 %vi, %vi, 1;");
    let (int, four, eight, string, sized) = (p.label(), p.label(), p.label(), p.label(), p.label());
    p.line("mov.u32 %vt, 0;");
    p.line("setp.ne.u32 %vstr, %vt, 0;");
    p.branch_if_any(b"diuxXo", &int);
    p.branch_if_any(b"c", &four);
    p.branch_if_any(b"s", &string);
    p.branch_if_any(b"pnfFeEgGaA", &eight);
    // `%%` and unknown conversions take no argument.
    p.line(&format!("bra {next};"));
    p.place(&int);
    p.line("selp.u32 %vsize, 8, 4, %vlong;");
    p.line(&format!("bra {sized};"));
    p.place(&four);
    p.line("mov.u32 %vsize, 4;");
    p.line(&format!("bra {sized};"));
    p.place(&string);
    p.line("mov.u32 %vt, 1;");
    p.line("setp.ne.u32 %vstr, %vt, 0;");
    p.place(&eight);
    p.line("mov.u32 %vsize, 8;");
    // One argument, aligned to its size, when there is room for it.
    p.place(&sized);
    p.line(&format!("setp.ge.u32 %vp, %vn, {MAX_ARGS};"));
    p.line(&format!("@%vp bra {stop};"));
    p.line("add.u32 %vt, %valen, %vsize;");
    p.line("sub.u32 %vt, %vt, 1;");
    p.line("neg.s32 %voff, %vsize;");
    p.line("and.b32 %voff, %vt, %voff;");
    p.line("add.u32 %vt, %voff, %vsize;");
    p.line("setp.gt.u32 %vp, %vt, %valim;");
    p.line(&format!("@%vp bra {stop};"));
    p.line("mov.u32 %valen, %vt;");
    p.line("add.u32 %vn, %vn, 1;");
    p.line(&format!("@!%vstr bra {next};"));
    // A `%s` pointer: NULL prints "(null)" on the host and carries no string.
    p.line("cvt.u64.u32 %va, %voff;");
    p.line("add.u64 %va, %vsa, %va;");
    p.line("ld.u64 %vs, [%va];");
    p.line("setp.eq.u64 %vp, %vs, 0;");
    p.line(&format!("@%vp bra {next};"));
    let write = p.label();
    p.line(&format!("@%vpass2 bra {write};"));
    // Pass 1: measure it.
    p.strlen(&MAX_STRING.to_string(), None);
    p.line("add.u32 %vk, %vk, 7;"); // 4 bytes of length, padding to 4
    p.line("and.b32 %vk, %vk, -4;");
    p.line("add.u32 %vstot, %vstot, %vk;");
    p.line(&format!("bra {next};"));
    // Pass 2: copy it, never past the record (the string may have changed since pass 1).
    p.place(&write);
    p.line("add.u32 %vt, %vwoff, 4;");
    p.line("setp.gt.u32 %vp, %vt, %vtotal;");
    p.line(&format!("@%vp bra {next};"));
    p.line("sub.u32 %vcap, %vtotal, %vt;");
    p.line(&format!("min.u32 %vcap, %vcap, {MAX_STRING};"));
    p.line("cvt.u64.u32 %vb, %vt;");
    p.line("add.u64 %vend, %vrec, %vb;");
    p.strlen("%vcap", Some("%vend"));
    p.line("cvt.u64.u32 %vb, %vwoff;");
    p.line("add.u64 %va, %vrec, %vb;");
    p.line("st.global.u32 [%va], %vk;");
    p.line("add.u32 %vk, %vk, 7;");
    p.line("and.b32 %vk, %vk, -4;");
    p.line("add.u32 %vwoff, %vwoff, %vk;");
    p.line("add.u32 %vnstr, %vnstr, 1;");
    p.line(&format!("bra {next};"));

    // End of a scan.
    let done = p.label();
    p.place(&end);
    p.line(&format!("@%vpass2 bra {done};"));
    // Reserve the record: header, arguments, format, strings; a multiple of 8 bytes.
    p.line(&format!("add.u32 %vtotal, %valen, {HEADER};"));
    p.line("add.u32 %vtotal, %vtotal, %vflen;");
    p.line("add.u32 %vtotal, %vtotal, 3;");
    p.line("and.b32 %vtotal, %vtotal, -4;");
    p.line("mov.u32 %vwoff, %vtotal;");
    p.line("add.u32 %vtotal, %vtotal, %vstot;");
    p.line("add.u32 %vtotal, %vtotal, 7;");
    p.line("and.b32 %vtotal, %vtotal, -8;");
    p.line("cvt.u64.u32 %vb, %vtotal;");
    p.line(&format!(
        "atom.global.add.u64 %vstart, [{HEAD_SYMBOL}], %vb;"
    ));
    p.line("add.u64 %vend, %vstart, %vb;");
    let full = p.label();
    p.line(&format!("setp.gt.u64 %vp, %vend, {BUFFER_SIZE};"));
    p.line(&format!("@%vp bra {full};"));
    p.line(&format!("mov.u64 %vrec, {BUFFER_SYMBOL};"));
    p.line("add.u64 %vrec, %vrec, %vstart;");
    p.line("st.global.u32 [%vrec], %vtotal;");
    p.line("st.global.u32 [%vrec+4], %valen;");
    p.line("st.global.u32 [%vrec+8], %vflen;");
    p.line("mov.u32 %vnstr, 0;");
    p.line("st.global.u32 [%vrec+12], %vnstr;");
    p.line(&format!("add.u64 %vs, %vrec, {HEADER};"));
    p.copy_bytes("%vargs", "%vs", "%valen");
    p.line("cvt.u64.u32 %vb, %valen;");
    p.line("add.u64 %vs, %vs, %vb;");
    p.copy_bytes("%vfmt", "%vs", "%vflen");
    // Pass 2 scans the record's copies, so what it writes matches what the host will read.
    p.line(&format!("add.u64 %vsa, %vrec, {HEADER};"));
    p.line("cvta.global.u64 %vsa, %vsa;");
    p.line("cvta.global.u64 %vsf, %vs;");
    p.line("mov.u32 %valim, %valen;");
    p.line("mov.u32 %vt, 1;");
    p.line("setp.ne.u32 %vpass2, %vt, 0;");
    p.line(&format!("bra {scan};"));
    p.place(&done);
    p.line("st.global.u32 [%vrec+12], %vnstr;");
    if returns {
        p.line(&format!("st.param.b32 [{RET}], %vn;"));
    }
    p.line("ret;");
    // The buffer is full. The one reservation that straddles its end marks the end of the
    // records, so the host does not read what an earlier launch left past them.
    p.place(&full);
    p.line(&format!("setp.ge.u64 %vp, %vstart, {BUFFER_SIZE};"));
    p.line(&format!("@%vp bra {fail};"));
    p.line(&format!("mov.u64 %vrec, {BUFFER_SYMBOL};"));
    p.line("add.u64 %vrec, %vrec, %vstart;");
    p.line("mov.u32 %vt, 0;");
    p.line("st.global.u32 [%vrec], %vt;");
    p.place(&fail);
    if returns {
        p.line("mov.u32 %vt, -1;");
        p.line(&format!("st.param.b32 [{RET}], %vt;"));
    }
    p.line("ret;");
    p.text.push_str("}\n");
    p.text
}

/// One record read back from a printf buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// The argument bytes as the caller packed them.
    pub args: &'a [u8],
    /// The format text.
    pub format: &'a [u8],
    /// The text of each non-NULL `%s` argument, in order.
    pub strings: Vec<&'a [u8]>,
}

fn u32_at(b: &[u8], at: usize) -> Option<usize> {
    let v = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(v.try_into().ok()?) as usize)
}

/// Decodes one record at the start of `b`: the record and its length, or `None` where `b`
/// holds no well-formed record (end of the records, or garbage a kernel wrote).
fn record(b: &[u8]) -> Option<(Record<'_>, usize)> {
    let total = u32_at(b, 0)?;
    if total < HEADER || !total.is_multiple_of(8) || total > b.len() {
        return None;
    }
    let r = &b[..total];
    let (args_len, fmt_len, n) = (u32_at(r, 4)?, u32_at(r, 8)?, u32_at(r, 12)?);
    let args_end = HEADER.checked_add(args_len)?;
    let fmt_end = args_end.checked_add(fmt_len)?;
    let args = r.get(HEADER..args_end)?;
    let format = r.get(args_end..fmt_end)?;
    let mut strings = Vec::new();
    let mut at = fmt_end.next_multiple_of(4);
    for _ in 0..n.min(MAX_ARGS) {
        let Some(len) = u32_at(r, at) else { break };
        let Some(s) = at
            .checked_add(4)
            .and_then(|s| r.get(s..s.checked_add(len)?))
        else {
            break;
        };
        strings.push(s);
        at = (at + 4 + len).next_multiple_of(4);
    }
    Some((
        Record {
            args,
            format,
            strings,
        },
        total,
    ))
}

/// The records in the first bytes of a printf buffer (its head's value of them), in the order
/// they were reserved. Stops at the first malformed record.
pub fn records(buf: &[u8]) -> Vec<Record<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some((r, len)) = buf.get(at..).and_then(record) {
        out.push(r);
        at += len;
    }
    out
}

/// Formats one record as C's `printf` would, appending at most `limit - out.len()` bytes.
/// Returns the number of arguments it used.
pub fn format_record(r: &Record<'_>, out: &mut Vec<u8>, limit: usize) -> i32 {
    let mut next = r.strings.iter();
    let mut args = BufferArgs::new(r.args, |_addr, max| {
        next.next()
            .map(|s| s[..s.len().min(max)].to_vec())
            .unwrap_or_default()
    });
    printf::format(r.format, &mut args, out, limit)
}

/// Formats the records of a printf buffer and hands each one's text to `put`, as long as it
/// fits in `room()` (a record that does not fit is dropped whole, as CUDA drops output past
/// its FIFO). Returns the number of records found.
pub fn deliver(buf: &[u8], room: &dyn Fn() -> usize, put: &mut dyn FnMut(&[u8])) -> usize {
    let all = records(buf);
    let mut text = Vec::new();
    for r in &all {
        let room = room();
        text.clear();
        // One byte more than fits tells a record that does not fit.
        format_record(r, &mut text, room.saturating_add(1));
        if text.len() <= room {
            put(&text);
        }
    }
    all.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_declarations_with_and_without_a_return_value() {
        let with = ".version 7.0\n.extern .func  (.param .b32 func_retval0) vprintf\n(\n\t.param .b64 vprintf_param_0,\n\t.param .b64 vprintf_param_1\n)\n;\n";
        let d = find_declaration(with).unwrap();
        assert!(d.returns);
        assert_eq!(&with[d.end - 1..d.end], ";");
        let without = "// .extern .func vprintf(.param .b64 x, .param .b64 y);\n.extern .func vprintf(.param .b64 a, .param .b64 b);";
        let d = find_declaration(without).unwrap();
        assert!(!d.returns);
        assert!(without[d.start..].starts_with(".extern"), "not the comment");
        assert!(
            find_declaration(".extern .func (.param .b32 r) vprintf(.param .b64 a);").is_none()
        );
        assert!(
            find_declaration(".extern .func (.param .b32 r) other(.param .b64 a, .param .b64 b);")
                .is_none()
        );
    }

    #[test]
    fn records_decode_and_garbage_stops() {
        let mut b = Vec::new();
        // "x=%d s=%s\n", 7, "hi"
        let fmt = b"x=%d s=%s\n";
        let mut args = 7u32.to_le_bytes().to_vec();
        args.extend_from_slice(&[0; 4]);
        args.extend_from_slice(&0x1000u64.to_le_bytes());
        let mut body = Vec::new();
        body.extend_from_slice(&args);
        body.extend_from_slice(fmt);
        while body.len() % 4 != 0 {
            body.push(0);
        }
        body.extend_from_slice(&2u32.to_le_bytes());
        body.extend_from_slice(b"hi\0\0");
        let total = (HEADER + body.len()).next_multiple_of(8);
        for v in [total, args.len(), fmt.len(), 1] {
            b.extend_from_slice(&(v as u32).to_le_bytes());
        }
        b.extend_from_slice(&body);
        b.resize(total, 0);
        b.extend_from_slice(&[0xff; 24]);
        let rs = records(&b);
        assert_eq!(rs.len(), 1);
        let mut out = Vec::new();
        assert_eq!(format_record(&rs[0], &mut out, 100), 2);
        assert_eq!(out, b"x=7 s=hi\n");
    }
}
