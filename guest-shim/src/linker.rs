//! The driver's JIT linker (`cuLinkCreate`, `cuLinkAddData`, `cuLinkAddFile`,
//! `cuLinkComplete`, `cuLinkDestroy`) and the JIT options it shares with
//! `cuModuleLoadDataEx`.
//!
//! The simulated GPU runs PTX, so vgpu links at the PTX level, in the guest:
//! the PTX inputs (and the PTX of fat binary inputs) become one PTX module,
//! with `.extern` declarations of what another input defines dropped, and the
//! "cubin" `cuLinkComplete` hands back is that PTX text, which
//! `cuModuleLoadData` loads on either executor (a real GPU compiles it).
//! Static libraries and objects give the PTX of their fat binaries, of which
//! the module takes only what it calls ([`link_ptx_with`]); cubin and LTO-IR
//! inputs, and libraries without PTX, cannot be linked this way; they fail
//! with `CUDA_ERROR_NOT_SUPPORTED` and say so in the error log.
//! `CU_JIT_MAX_REGISTERS` becomes a `.maxnreg` directive on every kernel.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::time::Instant;

use vgpu_proto::cuda;

use crate::driver as drv;
use crate::exports::c_name;
use crate::ffi::{CUresult, ffi, write_cstr};
use crate::out;

/// `CUjit_option` values the shim acts on.
pub mod opt {
    pub const MAX_REGISTERS: i32 = 0;
    pub const WALL_TIME: i32 = 2;
    pub const INFO_LOG_BUFFER: i32 = 3;
    pub const INFO_LOG_BUFFER_SIZE_BYTES: i32 = 4;
    pub const ERROR_LOG_BUFFER: i32 = 5;
    pub const ERROR_LOG_BUFFER_SIZE_BYTES: i32 = 6;
}

/// `CUjitInputType` values.
pub mod input {
    pub const CUBIN: i32 = 0;
    pub const PTX: i32 = 1;
    pub const FATBINARY: i32 = 2;
    pub const OBJECT: i32 = 3;
    pub const LIBRARY: i32 = 4;
    pub const NVVM: i32 = 5;
}

/// Most JIT options read from one call.
const MAX_OPTIONS: usize = 64;
/// Most inputs of one link.
const MAX_INPUTS: usize = 1024;
/// Most bytes of one link's inputs: what one module load can carry.
const MAX_LINK_BYTES: usize = vgpu_proto::frame::MAX_PAYLOAD - 64;

/// A log buffer of the caller's and the option slot its size is in and out of.
#[derive(Debug, Clone, Copy)]
struct LogBuffer {
    buf: *mut c_char,
    size_slot: *mut *mut c_void,
}

impl LogBuffer {
    /// Writes `text` (truncated) and stores the bytes written, NUL included.
    fn write(&self, text: &str) {
        // SAFETY: the option slot holds the buffer's size (CUDA JIT option contract); it stays
        // valid while the options do.
        let size = unsafe { self.size_slot.read() } as usize;
        if self.buf.is_null() || size == 0 {
            return;
        }
        // SAFETY: `buf` has `size` bytes (CUDA JIT option contract).
        let _ = unsafe { write_cstr(self.buf, i32::try_from(size).unwrap_or(i32::MAX), text) };
        let written = text.len().min(size - 1) + 1;
        // SAFETY: the size slot is in/out: the driver stores the bytes written.
        unsafe { self.size_slot.write(written as *mut c_void) };
    }
}

/// JIT options as given to `cuModuleLoadDataEx`, `cuLinkCreate` and `cuLinkAdd*`.
#[derive(Debug, Default, Clone, Copy)]
pub struct JitOptions {
    /// `CU_JIT_MAX_REGISTERS`.
    pub max_registers: Option<u32>,
    info_log: Option<LogBuffer>,
    error_log: Option<LogBuffer>,
    wall_time: Option<*mut *mut c_void>,
}

impl JitOptions {
    /// Reads the options; unknown options are accepted and ignored, as hints.
    ///
    /// # Safety
    /// `options` and `values` must hold `n` entries each (or be NULL with `n` 0), and the
    /// values of output options must stay valid while the options are used.
    pub unsafe fn read(n: c_uint, options: *const c_int, values: *mut *mut c_void) -> Self {
        let mut o = JitOptions::default();
        if n == 0 || options.is_null() || values.is_null() {
            return o;
        }
        let n = (n as usize).min(MAX_OPTIONS);
        // SAFETY: `n` entries each (this function's contract).
        let opts = unsafe { std::slice::from_raw_parts(options, n) };
        let slot = |i: usize| values.wrapping_add(i);
        // SAFETY: as above.
        let value = |i: usize| unsafe { slot(i).read() } as usize;
        let find = |which: i32| opts.iter().position(|&x| x == which);
        if let Some(i) = find(opt::MAX_REGISTERS) {
            o.max_registers = u32::try_from(value(i)).ok().filter(|&r| r > 0);
        }
        let log = |buf: i32, size: i32| match (find(buf), find(size)) {
            (Some(b), Some(s)) => Some(LogBuffer {
                buf: value(b) as *mut c_char,
                size_slot: slot(s),
            }),
            _ => None,
        };
        o.info_log = log(opt::INFO_LOG_BUFFER, opt::INFO_LOG_BUFFER_SIZE_BYTES);
        o.error_log = log(opt::ERROR_LOG_BUFFER, opt::ERROR_LOG_BUFFER_SIZE_BYTES);
        o.wall_time = find(opt::WALL_TIME).map(slot);
        o
    }

    /// Writes an error message to the error log, if one was given.
    pub fn error(&self, text: &str) {
        if let Some(l) = self.error_log {
            l.write(text);
        }
    }

    /// Writes a message to the info log, if one was given.
    pub fn info(&self, text: &str) {
        if let Some(l) = self.info_log {
            l.write(text);
        }
    }

    /// Stores the wall time spent, in milliseconds, if asked for.
    fn wall_time(&self, ms: f32) {
        if let Some(slot) = self.wall_time {
            // SAFETY: the option's value slot is an output holding a float (CUDA JIT option
            // contract); it stays valid while the options do.
            unsafe { slot.cast::<f32>().write_unaligned(ms) };
        }
    }
}

/// `s` without leading whitespace and comments.
fn skip_comments(mut s: &str) -> &str {
    loop {
        s = s.trim_start();
        if let Some(r) = s.strip_prefix("//") {
            s = r.find('\n').map_or("", |e| &r[e..]);
        } else if let Some(r) = s.strip_prefix("/*") {
            s = r.find("*/").map_or("", |e| &r[e + 2..]);
        } else {
            return s;
        }
    }
}

/// The name a `.func`/`.entry`/`.global` statement declares or defines.
fn declared_name(statement: &str) -> Option<&str> {
    let mut rest = skip_comments(statement);
    // Skip directives (.extern .visible .weak .func .entry .global .b8 .align 4 …) and a
    // return parameter list.
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix('.') {
            let end = r
                .find(|c: char| c.is_whitespace() || c == '(')
                .unwrap_or(r.len());
            rest = &r[end..];
            // `.align N`: the number is not a name.
            let t = rest.trim_start();
            if t.starts_with(|c: char| c.is_ascii_digit()) {
                let end = t.find(char::is_whitespace).unwrap_or(t.len());
                rest = &t[end..];
            }
        } else if let Some(r) = rest.strip_prefix('(') {
            rest = &r[r.find(')')? + 1..];
        } else {
            break;
        }
    }
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$' || c == '%'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// Top-level statements of a PTX text: (is a module header directive, the
/// statement with its body if any). Statements end at `;` outside braces, or
/// with their closing `}`.
fn statements(ptx: &str) -> Vec<(bool, &str)> {
    let mut out = Vec::new();
    let (mut depth, mut start, mut initializer) = (0usize, 0usize, false);
    let b = ptx.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i += ptx[i..].find('\n').unwrap_or(ptx.len() - i);
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += ptx[i..].find("*/").map_or(ptx.len() - i, |e| e + 2);
                continue;
            }
            b'"' => {
                i += 1 + ptx[i + 1..].find('"').unwrap_or(ptx.len() - i - 1);
            }
            b'{' => {
                // `= { … }` is an initializer: the statement goes on to its `;`.
                if depth == 0 {
                    initializer = ptx[start..i].trim_end().ends_with('=');
                }
                depth += 1;
            }
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 && !initializer {
                    out.push(&ptx[start..=i]);
                    start = i + 1;
                }
            }
            b';' if depth == 0 => {
                out.push(&ptx[start..=i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    // Header directives end at a line break, not a semicolon.
    let mut v = Vec::new();
    for s in out {
        let mut s = s;
        loop {
            let t = skip_comments(s);
            let header = [".version", ".target", ".address_size"]
                .iter()
                .any(|h| t.starts_with(h));
            if !header {
                break;
            }
            let end = t.find('\n').unwrap_or(t.len());
            v.push((true, &t[..end]));
            s = &t[end..];
        }
        if !s.trim().is_empty() {
            v.push((false, s));
        }
    }
    v
}

/// Adds `.maxnreg n` to every kernel of a PTX text.
pub fn with_max_registers(ptx: &str, n: u32) -> String {
    let mut out = String::with_capacity(ptx.len() + 64);
    for (header, s) in statements(ptx) {
        out.push_str(s);
        if header {
            out.push('\n');
        }
        // Statements came back with their bodies; directives go before the `{`.
        if !header && is_entry(s) {
            let at = out.len() - s.len() + s.find('{').unwrap_or(s.len());
            out.insert_str(at, &format!("\n.maxnreg {n}\n"));
        }
    }
    out
}

fn is_entry(statement: &str) -> bool {
    skip_comments(statement)
        .split_whitespace()
        .take_while(|w| w.starts_with('.'))
        .any(|w| w == ".entry")
        && statement.contains('{')
}

/// Whether a statement has `.weak` or `.common` linkage: of several definitions of its name (an
/// inline function's template instantiation or local static in every translation unit, the
/// environment variables numba declares `.common` in each module it links), the strong one or
/// else the first is kept, as the driver's linker does.
fn is_weak(statement: &str) -> bool {
    has_directive(statement, ".weak") || has_directive(statement, ".common")
}

/// Whether one of the directives a statement starts with is `directive`.
fn has_directive(statement: &str, directive: &str) -> bool {
    skip_comments(statement)
        .split_whitespace()
        .take_while(|t| t.starts_with('.'))
        .any(|t| t == directive)
}

/// Whether a statement is a function's prototype: a `.func` without a body.
fn is_prototype(statement: &str) -> bool {
    has_directive(statement, ".func") && !statement.contains('{')
}

fn is_declaration_only(statement: &str) -> bool {
    skip_comments(statement).starts_with(".extern") && !statement.contains('{')
}

/// PTX ISA version as a comparable number ("8.5" → 805).
fn version_number(v: &str) -> u32 {
    let mut it = v.trim().splitn(2, '.');
    let major: u32 = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let minor: u32 = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    major * 100 + minor
}

/// Links PTX modules into one: the newest `.version` and `.target` of the
/// inputs, their statements in order, and `.extern` declarations of names
/// another input defines (or that were already declared) dropped.
pub fn link_ptx(inputs: &[String]) -> Result<String, String> {
    link_ptx_with(inputs, &[])
}

/// Whether a byte can be part of a PTX identifier.
fn ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$'
}

/// The statements of `libraries` that `inputs` need, in library order: the definitions of the
/// names `inputs` declare `.extern` and define nowhere, what those use in turn (functions,
/// variables, prototypes), and the `.extern` declarations the libraries make of what they use
/// (the device's own functions, such as the device runtime's system calls). As a linker takes
/// only the members of a static library that resolve something.
fn library_statements<'a>(
    inputs: &[Vec<(bool, &'a str)>],
    libraries: &[Vec<(bool, &'a str)>],
) -> Vec<&'a str> {
    let body = |list: &[Vec<(bool, &'a str)>]| -> Vec<&'a str> {
        list.iter()
            .flatten()
            .filter(|(h, _)| !h)
            .map(|(_, s)| *s)
            .collect()
    };
    let own = body(inputs);
    // The libraries' named statements, each name read once, and where each name stands.
    let lib: Vec<(&'a str, &'a str)> = body(libraries)
        .into_iter()
        .filter_map(|s| declared_name(s).map(|n| (n, s)))
        .collect();
    let mut by_name: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, &(n, _)) in lib.iter().enumerate() {
        by_name.entry(n).or_default().push(i);
    }
    let own_defined: HashSet<&str> = own
        .iter()
        .filter(|s| !is_declaration_only(s))
        .filter_map(|s| declared_name(s))
        .collect();
    let mut wanted: Vec<&str> = own
        .iter()
        .filter(|s| is_declaration_only(s))
        .filter_map(|s| declared_name(s))
        .filter(|n| !own_defined.contains(n) && by_name.contains_key(n))
        .collect();
    let mut taken: HashSet<&str> = HashSet::new();
    while let Some(name) = wanted.pop() {
        if !taken.insert(name) {
            continue;
        }
        for &i in by_name.get(name).into_iter().flatten() {
            for ident in lib[i]
                .1
                .split(|c: char| !(c.is_ascii() && ident_byte(c as u8)))
            {
                if by_name.contains_key(ident)
                    && !own_defined.contains(ident)
                    && !taken.contains(ident)
                {
                    wanted.push(ident);
                }
            }
        }
    }
    let lib_defined: HashSet<&str> = lib
        .iter()
        .filter(|(_, s)| !is_declaration_only(s))
        .map(|&(n, _)| n)
        .collect();
    let mut declared = HashSet::new();
    lib.into_iter()
        .filter(|&(n, s)| {
            // One `.extern` declaration of what the libraries use but do not define.
            taken.contains(n)
                && (!is_declaration_only(s) || (!lib_defined.contains(n) && declared.insert(n)))
        })
        .map(|(_, s)| s)
        .collect()
}

/// [`link_ptx`] with static libraries' PTX (`libraries`): of those, only what the inputs use
/// ([`library_statements`]), placed before the inputs' statements; their `.target` does not
/// count (the module is for the inputs' target).
pub fn link_ptx_with(inputs: &[String], libraries: &[String]) -> Result<String, String> {
    let parsed: Vec<Vec<(bool, &str)>> = inputs.iter().map(|p| statements(p)).collect();
    let libs: Vec<Vec<(bool, &str)>> = libraries.iter().map(|p| statements(p)).collect();
    let from_libraries = library_statements(&parsed, &libs);
    let (mut defined, mut strong) = (HashSet::new(), HashSet::new());
    for s in parsed
        .iter()
        .flatten()
        .filter(|(h, _)| !h)
        .map(|(_, s)| *s)
        .chain(from_libraries.iter().copied())
    {
        if !is_declaration_only(s)
            && let Some(n) = declared_name(s)
        {
            defined.insert(n);
            if !is_weak(s) {
                strong.insert(n);
            }
        }
    }
    let (mut version, mut version_text) = (0, String::from(".version 6.0"));
    let (mut target, mut target_text) = (0, String::from(".target sm_52"));
    let library_headers = if from_libraries.is_empty() {
        &[][..]
    } else {
        &libs[..]
    };
    for (_, h) in parsed
        .iter()
        .flatten()
        .chain(
            library_headers
                .iter()
                .flatten()
                .filter(|(h, s)| *h && s.trim().starts_with(".version")),
        )
        .filter(|(h, _)| *h)
    {
        let h = h.trim();
        if let Some(v) = h.strip_prefix(".version") {
            if version_number(v) > version {
                version = version_number(v);
                version_text = h.to_string();
            }
        } else if let Some(t) = h.strip_prefix(".target") {
            let arch: u32 = t
                .trim()
                .trim_start_matches("sm_")
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap_or(0);
            if arch > target {
                target = arch;
                target_text = h.to_string();
            }
        }
    }
    let mut out = format!("{version_text}\n{target_text}\n.address_size 64\n");
    for s in &from_libraries {
        out.push_str(s);
        out.push('\n');
    }
    let mut declared: HashSet<&str> = from_libraries
        .iter()
        .filter(|s| is_declaration_only(s))
        .filter_map(|s| declared_name(s))
        .collect();
    let mut seen_definitions: HashSet<&str> = from_libraries
        .iter()
        .filter(|s| !is_declaration_only(s) && s.contains('{'))
        .filter_map(|s| declared_name(s))
        .collect();
    for s in parsed.iter().flatten().filter(|(h, _)| !h).map(|(_, s)| *s) {
        let name = declared_name(s);
        if is_declaration_only(s) {
            if let Some(n) = name
                && (defined.contains(n) || !declared.insert(n))
            {
                continue;
            }
        } else if let Some(n) = name
            && is_weak(s)
        {
            // A weak function's prototype (nvcc declares a template's instantiation before the
            // code that calls it) goes once, and not after its definition.
            let kept = !strong.contains(n)
                && if is_prototype(s) {
                    !seen_definitions.contains(n) && declared.insert(n)
                } else {
                    seen_definitions.insert(n)
                };
            if !kept {
                continue;
            }
        } else if let Some(n) = name
            && s.contains('{')
            && !seen_definitions.insert(n)
        {
            return Err(format!("`{n}` is defined by more than one input"));
        }
        out.push_str(s);
    }
    out.push('\n');
    Ok(out)
}

/// The state of one `cuLinkCreate` … `cuLinkDestroy`.
#[derive(Debug)]
pub struct LinkState {
    options: JitOptions,
    ptx: Vec<String>,
    /// The PTX of static libraries and objects (`CU_JIT_INPUT_LIBRARY`, `_OBJECT`), linked
    /// only as far as the PTX inputs use it.
    libraries: Vec<String>,
    bytes: usize,
    started: Instant,
    /// The linked image, NUL-terminated; `cuLinkComplete` hands out a pointer into it.
    image: Vec<u8>,
}

impl LinkState {
    fn add(&mut self, kind: i32, data: &[u8], name: &str) -> drv::CuRes<()> {
        if self.ptx.len() == MAX_INPUTS || self.bytes + data.len() > MAX_LINK_BYTES {
            self.options.error(&format!(
                "vgpu links at most {MAX_INPUTS} inputs of {MAX_LINK_BYTES} bytes in all"
            ));
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let text = match kind {
            input::PTX => {
                let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
                String::from_utf8(data[..end].to_vec()).map_err(|_| {
                    self.options
                        .error(&format!("{name}: PTX is not UTF-8 text"));
                    cuda::CUDA_ERROR_INVALID_PTX
                })?
            }
            input::FATBINARY => {
                let (arch, range) = (drv::device_arch()?, drv::device_ptx_range()?);
                let ptx = vgpu_fatbin::ptx_in(data, arch, range).map_err(|e| {
                    self.options.error(&format!("{name}: {e}"));
                    cuda::CUDA_ERROR_NO_BINARY_FOR_GPU
                })?;
                String::from_utf8(ptx).map_err(|_| cuda::CUDA_ERROR_INVALID_PTX)?
            }
            input::LIBRARY | input::OBJECT => {
                let found =
                    vgpu_fatbin::archive::device_ptx(data, drv::device_arch()?).map_err(|e| {
                        self.options.error(&format!("{name}: {e}"));
                        cuda::CUDA_ERROR_INVALID_IMAGE
                    })?;
                if found.is_empty() {
                    self.options.error(&format!(
                        "{name}: holds no PTX (vgpu links PTX; its device code is SASS only)"
                    ));
                    return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
                }
                for ptx in found {
                    let text = String::from_utf8(ptx).map_err(|_| cuda::CUDA_ERROR_INVALID_PTX)?;
                    self.bytes += text.len();
                    self.libraries.push(text);
                }
                return Ok(());
            }
            input::CUBIN | input::NVVM => {
                let what = match kind {
                    input::CUBIN => "a cubin",
                    _ => "NVVM IR (LTO)",
                };
                self.options.error(&format!(
                    "{name}: vgpu links PTX (and the PTX of fat binaries); {what} cannot be linked: build it as PTX"
                ));
                return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
            }
            _ => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
        };
        self.bytes += text.len();
        self.ptx.push(text);
        Ok(())
    }

    fn complete(&mut self) -> drv::CuRes<(*const u8, usize)> {
        if self.ptx.is_empty() {
            self.options.error("nothing to link: add PTX first");
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let mut linked = link_ptx_with(&self.ptx, &self.libraries).map_err(|e| {
            self.options.error(&e);
            cuda::CUDA_ERROR_INVALID_PTX
        })?;
        if let Some(n) = self.options.max_registers {
            linked = with_max_registers(&linked, n);
        }
        crate::debug!(
            "cuLinkComplete: {} PTX inputs, register limit {:?}",
            self.ptx.len(),
            self.options.max_registers
        );
        self.options.info(&format!(
            "vgpu linked {} PTX inputs into {} bytes of PTX",
            self.ptx.len(),
            linked.len()
        ));
        self.options
            .wall_time(self.started.elapsed().as_secs_f32() * 1e3);
        self.image = linked.into_bytes();
        self.image.push(0);
        Ok((self.image.as_ptr(), self.image.len()))
    }
}

/// A link state from the caller's handle.
///
/// # Safety
/// `state` must be NULL or a handle from [`cuLinkCreate_v2`] not yet destroyed.
unsafe fn state<'a>(state: *mut LinkState) -> drv::CuRes<&'a mut LinkState> {
    // SAFETY: per this function's contract.
    unsafe { state.as_mut() }.ok_or(cuda::CUDA_ERROR_INVALID_HANDLE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkCreate_v2(
    n: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
    out_state: *mut *mut LinkState,
) -> CUresult {
    ffi("cuLinkCreate_v2", || {
        drv::ctx_get_current()?;
        // SAFETY: the caller's option arrays (CUDA contract: valid for the link's life).
        let options = unsafe { JitOptions::read(n, options, values) };
        let s = Box::new(LinkState {
            options,
            ptx: Vec::new(),
            libraries: Vec::new(),
            bytes: 0,
            started: Instant::now(),
            image: Vec::new(),
        });
        if out_state.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(out_state, Box::into_raw(s))
    })
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLinkAddData_v2(
    link: *mut LinkState,
    kind: c_int,
    data: *const c_void,
    size: usize,
    name: *const c_char,
    _n: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    ffi("cuLinkAddData_v2", || {
        // SAFETY: the caller's link state (CUDA contract).
        let s = unsafe { state(link) }?;
        if data.is_null() || size == 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let name = if name.is_null() {
            "input"
        } else {
            // SAFETY: a C string when not NULL (CUDA contract).
            unsafe { c_name(name) }.unwrap_or("input")
        };
        // SAFETY: `data` has `size` bytes (CUDA contract).
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) };
        s.add(kind, bytes, name)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkAddFile_v2(
    link: *mut LinkState,
    kind: c_int,
    path: *const c_char,
    _n: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    ffi("cuLinkAddFile_v2", || {
        // SAFETY: the caller's link state (CUDA contract).
        let s = unsafe { state(link) }?;
        // SAFETY: the caller's C string (CUDA contract).
        let path = unsafe { c_name(path) }?;
        let meta = std::fs::metadata(path).map_err(|_| cuda::CUDA_ERROR_FILE_NOT_FOUND)?;
        if meta.len() > MAX_LINK_BYTES as u64 {
            s.options
                .error(&format!("{path}: larger than {MAX_LINK_BYTES} bytes"));
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = std::fs::read(path).map_err(|_| cuda::CUDA_ERROR_FILE_NOT_FOUND)?;
        s.add(kind, &bytes, path)
    })
}

// CUDA 5.5's names, which the `_v2` forms replaced in 6.5 with the same arguments. Libraries
// still resolve them with `dlsym` (cuDNN 9 does, and says so on stderr when they are missing).

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkCreate(
    n: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
    out_state: *mut *mut LinkState,
) -> CUresult {
    // SAFETY: the same contract as the `_v2` form's.
    unsafe { cuLinkCreate_v2(n, options, values, out_state) }
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLinkAddData(
    link: *mut LinkState,
    kind: c_int,
    data: *const c_void,
    size: usize,
    name: *const c_char,
    n: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the same contract as the `_v2` form's.
    unsafe { cuLinkAddData_v2(link, kind, data, size, name, n, options, values) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkAddFile(
    link: *mut LinkState,
    kind: c_int,
    path: *const c_char,
    n: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the same contract as the `_v2` form's.
    unsafe { cuLinkAddFile_v2(link, kind, path, n, options, values) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkComplete(
    link: *mut LinkState,
    image: *mut *const c_void,
    size: *mut usize,
) -> CUresult {
    ffi("cuLinkComplete", || {
        // SAFETY: the caller's link state (CUDA contract).
        let s = unsafe { state(link) }?;
        let (p, n) = s.complete()?;
        out!(image, p.cast::<c_void>())?;
        if !size.is_null() {
            out!(size, n)?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkDestroy(link: *mut LinkState) -> CUresult {
    ffi("cuLinkDestroy", || {
        if link.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_HANDLE);
        }
        // SAFETY: a state from cuLinkCreate_v2 (CUDA contract), destroyed once.
        drop(unsafe { Box::from_raw(link) });
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: &str = r#"//
// Generated by NVIDIA NVVM Compiler
.version 8.5
.target sm_80
.address_size 64

.extern .func  (.param .b32 func_retval0) helper
(
	.param .b32 helper_param_0
)
;
.extern .func  (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;
.global .align 4 .b8 table[16];

.visible .entry kern(
	.param .u64 kern_param_0
)
{
	.reg .b32 	%r<3>;
	ret;
}
"#;

    const HELPER: &str = r#".version 7.0
.target sm_52
.address_size 64

.extern .func  (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;
.visible .func  (.param .b32 func_retval0) helper(
	.param .b32 helper_param_0
)
{
	.reg .b32 	%r<2>;
	st.param.b32 	[func_retval0+0], %r1;
	ret;
}
"#;

    #[test]
    fn names_of_declarations_and_definitions() {
        assert_eq!(
            declared_name(".extern .func  (.param .b32 func_retval0) helper\n(\n.param .b32 x\n);"),
            Some("helper")
        );
        assert_eq!(
            declared_name(".visible .entry kern(\n.param .u64 p\n)\n{ ret; }"),
            Some("kern")
        );
        assert_eq!(
            declared_name(".global .align 4 .b8 table[16];"),
            Some("table")
        );
    }

    #[test]
    fn libraries_give_only_what_the_inputs_call() {
        let input = ".version 7.0\n.target sm_80\n.address_size 64\n\
            .extern .func (.param .b32 r) lib_a(.param .b32 x);\n\
            .visible .entry k() { .reg .b32 %r<2>; { .param .b32 p; .param .b32 q; \
            st.param.b32 [p], 1; call.uni (q), lib_a, (p); ld.param.b32 %r1, [q]; } ret; }\n"
            .to_string();
        let lib = ".version 7.8\n.target sm_121\n.address_size 64\n\
            .extern .func (.param .b32 r) __sys(.param .b32 x);\n\
            .global .align 4 .u32 lib_var;\n\
            .func (.param .b32 r) lib_b(.param .b32 x) { .reg .b32 %r<2>; \
            ld.global.u32 %r1, [lib_var]; { .param .b32 p; .param .b32 q; \
            call.uni (q), __sys, (p); } st.param.b32 [r], %r1; ret; }\n\
            .visible .func (.param .b32 r) lib_a(.param .b32 x) { { .param .b32 p; \
            .param .b32 q; call.uni (q), lib_b, (p); } ret; }\n\
            .visible .func unused() { ret; }\n\
            .visible .entry lib_kernel() { ret; }\n"
            .to_string();
        let out = link_ptx_with(std::slice::from_ref(&input), &[lib]).unwrap();
        for wanted in [
            ".func (.param .b32 r) lib_b(",
            ".visible .func (.param .b32 r) lib_a(",
            ".global .align 4 .u32 lib_var;",
            ".extern .func (.param .b32 r) __sys(",
        ] {
            assert!(out.contains(wanted), "{wanted} missing:\n{out}");
        }
        for unwanted in [
            "unused",
            "lib_kernel",
            ".extern .func (.param .b32 r) lib_a",
        ] {
            assert!(!out.contains(unwanted), "{unwanted} linked:\n{out}");
        }
        assert!(
            out.contains(".target sm_80") && out.contains(".version 7.8"),
            "{out}"
        );
        assert!(
            out.find("lib_a(").unwrap() < out.find(".entry k").unwrap(),
            "library code comes before its callers"
        );
        // Nothing called: nothing taken, and the library's version does not count.
        let plain = ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry k() { ret; }\n";
        let out = link_ptx_with(&[plain.to_string()], &[input]).unwrap();
        assert!(
            !out.contains("lib_a") && out.contains(".version 7.0"),
            "{out}"
        );
    }

    #[test]
    fn linking_resolves_externs_against_other_inputs() {
        let linked = link_ptx(&[KERNEL.to_string(), HELPER.to_string()]).unwrap();
        assert!(linked.starts_with(".version 8.5\n.target sm_80\n.address_size 64\n"));
        // `helper` is defined by the second input: its extern declaration goes.
        assert!(!linked.contains(".extern .func  (.param .b32 func_retval0) helper"));
        assert_eq!(
            linked
                .matches(".visible .func  (.param .b32 func_retval0) helper(")
                .count(),
            1
        );
        // `vprintf` is declared by both and defined by neither: declared once.
        assert_eq!(linked.matches("vprintf\n(").count(), 1);
        assert_eq!(linked.matches(".version").count(), 1);
        assert!(linked.contains(".visible .entry kern("));
        assert!(linked.contains(".global .align 4 .b8 table[16];"));
    }

    #[test]
    fn a_name_defined_twice_is_an_error() {
        let e = link_ptx(&[HELPER.to_string(), HELPER.to_string()]).unwrap_err();
        assert!(
            e.contains("`helper` is defined by more than one input"),
            "{e}"
        );
    }

    #[test]
    fn weak_definitions_are_kept_once_and_a_strong_one_wins() {
        // What nvcc -rdc emits for an inline function's local static and template code in
        // every translation unit that uses them.
        let unit = |kernel: &str, strong: bool| {
            format!(
                ".version 7.8\n.target sm_80\n.address_size 64\n\
                 .weak .func (.param .b32 func_retval0) twice(.param .b32 twice_param_0);\n\
                 .weak .global .align 4 .b8 _ZZ5orderE7__xform[8] = {{3, 0, 0, 0, 4, 0, 0, 0}};\n\
                 .weak .func (.param .b32 func_retval0) twice(.param .b32 twice_param_0)\n\
                 {{ .reg .b32 %r<2>; ld.param.u32 %r1, [twice_param_0]; \
                 st.param.b32 [func_retval0+0], %r1; ret; }}\n\
                 {} .func (.param .b32 func_retval0) pick()\n\
                 {{ .reg .b32 %r<2>; mov.u32 %r1, {}; st.param.b32 [func_retval0+0], %r1; ret; }}\n\
                 .visible .entry {kernel}() {{ ret; }}\n",
                if strong { ".visible" } else { ".weak" },
                u32::from(strong)
            )
        };
        let linked = link_ptx(&[unit("a", false), unit("b", true), unit("c", false)]).unwrap();
        assert_eq!(
            linked.matches("_ZZ5orderE7__xform[8]").count(),
            1,
            "{linked}"
        );
        // The first unit's prototype and definition; the others' neither.
        assert_eq!(linked.matches("twice(").count(), 2, "{linked}");
        let prototype = linked.find("twice(.param .b32 twice_param_0);").unwrap();
        assert!(prototype < linked.find("twice(.param .b32 twice_param_0)\n{").unwrap());
        assert_eq!(linked.matches("pick()").count(), 1, "{linked}");
        assert!(linked.contains(".visible .func (.param .b32 func_retval0) pick()"));
        assert!(linked.contains("mov.u32 %r1, 1;") && !linked.contains("mov.u32 %r1, 0;"));
        for k in ["a", "b", "c"] {
            assert!(
                linked.contains(&format!(".visible .entry {k}()")),
                "{linked}"
            );
        }
        // `.common` variables (numba's environment pointers) likewise.
        let common = |kernel: &str| {
            format!(
                ".version 7.8\n.target sm_80\n.address_size 64\n\
                 .common .global .align 8 .u64 _ZN08NumbaEnv1fE;\n\
                 .visible .entry {kernel}() {{ ret; }}\n"
            )
        };
        let linked = link_ptx(&[common("x"), common("y")]).unwrap();
        assert_eq!(linked.matches("_ZN08NumbaEnv1fE").count(), 1, "{linked}");
        // Strong definitions twice are still an error.
        let e = link_ptx(&[unit("a", true), unit("b", true)]).unwrap_err();
        assert!(
            e.contains("`pick` is defined by more than one input"),
            "{e}"
        );
    }

    #[test]
    fn max_registers_become_maxnreg_on_every_kernel() {
        let p = with_max_registers(KERNEL, 32);
        assert!(
            p.contains(".param .u64 kern_param_0\n)\n\n.maxnreg 32\n{"),
            "{p}"
        );
        assert_eq!(p.matches(".maxnreg").count(), 1);
        assert_eq!(p.matches(".version 8.5\n").count(), 1);
    }

    #[test]
    fn comments_and_strings_do_not_end_statements() {
        let s =
            statements(".version 7.0\n// a; comment {\n.global .b8 s[3] = {97, 59, 0}; /* x; */\n");
        assert_eq!(s.len(), 2, "{s:?}");
        assert!(s[0].0);
    }
}
