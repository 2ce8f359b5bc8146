//! PTX parser: tokens to a small syntax tree. Name resolution and instruction checking happen in
//! `decode`.

use crate::error::LoadError;
use crate::lexer::{Tok, Token};
use crate::watch::Ticker;

/// Deepest `{...}` nesting accepted (scopes and initializers); deeper input is rejected instead of
/// risking stack exhaustion.
const MAX_NESTING: usize = 64;

/// A parsed module.
#[derive(Debug, Default)]
pub(crate) struct Ast {
    pub version: (u32, u32),
    pub target: Vec<String>,
    pub address_size: u32,
    pub items: Vec<Item>,
}

#[derive(Debug)]
pub(crate) enum Item {
    Var(VarDecl),
    Func(FuncDecl),
}

/// State spaces of variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VarSpace {
    Global,
    Const,
    Shared,
    Local,
    Param,
    Reg,
}

#[derive(Debug, Clone)]
pub(crate) struct VarDecl {
    pub line: usize,
    pub space: VarSpace,
    pub is_extern: bool,
    pub align: Option<u64>,
    pub vec: u32,
    pub ty: String,
    pub name: String,
    /// Array dimensions; `None` is `[]` (size from the initializer, or extern dynamic shared).
    pub dims: Vec<Option<u64>>,
    pub init: Option<Init>,
    /// `.attribute(.managed)`.
    pub managed: bool,
}

#[derive(Debug, Clone)]
pub(crate) enum Init {
    Scalar(Lit),
    List(Vec<Init>),
}

#[derive(Debug, Clone)]
pub(crate) enum Lit {
    Int(u64),
    F32(u32),
    F64(u64),
    /// Address of a variable or function, plus an offset (`sym`, `sym+8`, `generic(sym)`).
    Sym(String, i64),
}

#[derive(Debug)]
pub(crate) struct FuncDecl {
    pub line: usize,
    pub is_entry: bool,
    pub name: String,
    pub rets: Vec<VarDecl>,
    pub params: Vec<VarDecl>,
    /// `.maxntid`, `.reqntid`, `.minnctapersm`, ... with their numbers.
    pub perf: Vec<(String, Vec<u64>)>,
    pub body: Option<Vec<Stmt>>,
}

#[derive(Debug)]
pub(crate) enum Stmt {
    Reg {
        line: usize,
        ty: String,
        names: Vec<RegName>,
    },
    Var(VarDecl),
    Label {
        line: usize,
        name: String,
    },
    /// `name: .callprototype (rets) _ (params);`
    Prototype {
        line: usize,
        name: String,
        rets: Vec<VarDecl>,
        params: Vec<VarDecl>,
    },
    Inst(Instr),
    Open,
    Close,
}

#[derive(Debug)]
pub(crate) enum RegName {
    One(String),
    /// `%r<10>` declares `%r0` ... `%r9`.
    Range(String, u32),
}

#[derive(Debug, Clone)]
pub(crate) struct Instr {
    pub line: usize,
    /// `@p` / `@!p`: (negated, predicate name).
    pub guard: Option<(bool, String)>,
    /// Base opcode (`ld`).
    pub opcode: String,
    /// Modifiers in order (`global`, `v4`, `f32`).
    pub mods: Vec<String>,
    pub operands: Vec<Operand>,
}

impl Instr {
    /// The full opcode as written (`ld.global.v4.f32`), for messages.
    pub fn full_name(&self) -> String {
        let mut s = self.opcode.clone();
        for m in &self.mods {
            s.push('.');
            s.push_str(m);
        }
        s
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Operand {
    /// A register, special register (`%tid.x`), label, variable or function name.
    Name(String),
    /// `!%p` (negated predicate source).
    NotName(String),
    /// `%p|%q` (setp's two destinations).
    Pair(String, String),
    Int(u64),
    F32(u32),
    F64(u64),
    /// `[base+offset]`; `base` None for an absolute address.
    Addr(Option<String>, i64),
    /// `{a, b, ...}` vector operand; elements are `Name` or `Sink` (or immediates).
    Vec(Vec<Operand>),
    /// `(a, b, ...)` call argument list.
    List(Vec<Operand>),
    /// `_`.
    Sink,
    /// `sym+off` used as a value (the address of a variable plus an offset).
    SymOff(String, i64),
    /// `[handle, coords]` (or `[handle, sampler, coords]`): the texture or surface operand of
    /// `tex`, `tld4`, `suld` and `sust`; the operands after the handle in order.
    Tex(String, Vec<Operand>),
    /// `%r.b0`, `%r.h1`, `%r.b3210`, `%r.h10`: the parts of a register a video instruction
    /// reads or writes.
    Part(String, String),
    /// `-%r` (or `-%r.b0`): a negated register source of `vmad`.
    Neg(Box<Operand>),
}

/// Whether a suffix is a video instruction's part selector (`b0`…`b7654`, `h0`…`h32`).
fn is_part_selector(s: &str) -> bool {
    let digits = s.strip_prefix(['b', 'h']).unwrap_or("");
    (1..=4).contains(&digits.len()) && digits.bytes().all(|d| d.is_ascii_digit())
}

struct Parser<'a, 't> {
    toks: &'a [Token],
    pos: usize,
    ticker: &'a mut Ticker<'t>,
}

impl<'a> Parser<'a, '_> {
    fn peek(&self) -> Option<&'a Tok> {
        self.toks.get(self.pos).map(|t| &t.kind)
    }

    fn peek_at(&self, n: usize) -> Option<&'a Tok> {
        self.toks.get(self.pos + n).map(|t| &t.kind)
    }

    fn line(&self) -> usize {
        self.toks
            .get(self.pos)
            .or_else(|| self.toks.last())
            .map_or(0, |t| t.line)
    }

    fn next(&mut self) -> Option<&'a Tok> {
        let t = self.toks.get(self.pos).map(|t| &t.kind);
        if t.is_some() {
            self.pos += 1;
        }
        t
    }

    fn err(&self, msg: impl Into<String>) -> LoadError {
        LoadError::invalid(self.line(), msg)
    }

    fn eat_punct(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Punct(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_punct(&mut self, c: char) -> Result<(), LoadError> {
        if self.eat_punct(c) {
            Ok(())
        } else {
            Err(self.err(format!("expected `{c}`, found {}", self.describe())))
        }
    }

    fn describe(&self) -> String {
        match self.peek() {
            None => "end of input".into(),
            Some(Tok::Ident(s)) => format!("`{s}`"),
            Some(Tok::Dot(s)) => format!("`.{s}`"),
            Some(Tok::Int(v)) => format!("`{v}`"),
            Some(Tok::F32(_)) | Some(Tok::F64(_)) => "a float literal".into(),
            Some(Tok::Str(s)) => format!("\"{s}\""),
            Some(Tok::Punct(c)) => format!("`{c}`"),
        }
    }

    fn ident(&mut self) -> Result<String, LoadError> {
        match self.next() {
            Some(Tok::Ident(s)) => Ok(s.clone()),
            _ => {
                self.pos = self.pos.saturating_sub(1);
                Err(self.err(format!("expected a name, found {}", self.describe())))
            }
        }
    }

    fn int(&mut self) -> Result<u64, LoadError> {
        match self.next() {
            Some(Tok::Int(v)) => Ok(*v),
            _ => {
                self.pos = self.pos.saturating_sub(1);
                Err(self.err(format!("expected an integer, found {}", self.describe())))
            }
        }
    }

    fn peek_dot(&self) -> Option<&'a str> {
        match self.peek() {
            Some(Tok::Dot(s)) => Some(s.as_str()),
            _ => None,
        }
    }

    /// Skips the rest of the current source line (for `.loc`, `.file`).
    fn skip_line(&mut self, line: usize) {
        while self.toks.get(self.pos).is_some_and(|t| t.line == line) {
            self.pos += 1;
        }
    }

    /// Skips a balanced `{ ... }` group starting at the current `{`.
    fn skip_braces(&mut self) -> Result<(), LoadError> {
        self.expect_punct('{')?;
        let mut depth = 1usize;
        while depth > 0 {
            match self.next() {
                None => return Err(self.err("unterminated `{`")),
                Some(Tok::Punct('{')) => depth += 1,
                Some(Tok::Punct('}')) => depth -= 1,
                _ => {}
            }
        }
        Ok(())
    }

    fn skip_to_semicolon(&mut self) -> Result<(), LoadError> {
        loop {
            match self.next() {
                None => return Err(self.err("expected `;`")),
                Some(Tok::Punct(';')) => return Ok(()),
                _ => {}
            }
        }
    }

    fn module(&mut self) -> Result<Ast, LoadError> {
        let mut ast = Ast {
            address_size: 64,
            ..Ast::default()
        };
        while let Some(tok) = self.peek() {
            let line = self.line();
            self.ticker.tick(1, line)?;
            match tok {
                Tok::Dot(d) => match d.as_str() {
                    "version" => {
                        self.pos += 1;
                        ast.version = match self.next() {
                            Some(Tok::F64(bits)) => {
                                let v = f64::from_bits(*bits);
                                let major = v.trunc();
                                ((major as u32), ((v - major) * 10.0).round() as u32)
                            }
                            Some(Tok::Int(v)) => (u32::try_from(*v).unwrap_or(u32::MAX), 0),
                            _ => return Err(LoadError::invalid(line, "malformed .version")),
                        };
                    }
                    "target" => {
                        self.pos += 1;
                        ast.target.push(self.ident()?);
                        while self.eat_punct(',') {
                            ast.target.push(self.ident()?);
                        }
                    }
                    "address_size" => {
                        self.pos += 1;
                        let v = self.int()?;
                        ast.address_size = u32::try_from(v).unwrap_or(0);
                    }
                    "file" | "loc" => {
                        self.pos += 1;
                        self.skip_line(line);
                    }
                    "section" => {
                        self.pos += 1;
                        while !matches!(self.peek(), Some(Tok::Punct('{')) | None) {
                            self.pos += 1;
                        }
                        self.skip_braces()?;
                    }
                    "pragma" => {
                        self.pos += 1;
                        self.skip_to_semicolon()?;
                    }
                    _ => self.top_item(&mut ast)?,
                },
                _ => {
                    return Err(self.err(format!("unexpected {} at module scope", self.describe())));
                }
            }
        }
        Ok(ast)
    }

    fn top_item(&mut self, ast: &mut Ast) -> Result<(), LoadError> {
        let mut is_extern = false;
        loop {
            match self.peek_dot() {
                Some("visible") | Some("weak") | Some("common") => self.pos += 1,
                Some("extern") => {
                    is_extern = true;
                    self.pos += 1;
                }
                _ => break,
            }
        }
        match self.peek_dot() {
            Some("entry") | Some("func") => {
                let f = self.function()?;
                ast.items.push(Item::Func(f));
                Ok(())
            }
            Some("global") | Some("const") | Some("shared") | Some("local") => {
                let mut v = self.var_decl(0)?;
                v.is_extern = is_extern;
                self.expect_punct(';')?;
                ast.items.push(Item::Var(v));
                Ok(())
            }
            Some(d @ ("tex" | "surfref" | "texref" | "samplerref")) => Err(LoadError::unsupported(
                self.line(),
                format!("unsupported directive `.{d}`"),
            )),
            Some(d) => Err(self.err(format!("unknown directive `.{d}`"))),
            None => Err(self.err(format!("unexpected {}", self.describe()))),
        }
    }

    /// `.space [.align N] [.ptr ...] [.vN] .type name[dims] [= init]` (without the `;`).
    fn var_decl(&mut self, depth: usize) -> Result<VarDecl, LoadError> {
        let line = self.line();
        let space = match self.next() {
            Some(Tok::Dot(s)) => match s.as_str() {
                "global" => VarSpace::Global,
                "const" => VarSpace::Const,
                "shared" => VarSpace::Shared,
                "local" => VarSpace::Local,
                "param" => VarSpace::Param,
                "reg" => VarSpace::Reg,
                other => {
                    return Err(LoadError::invalid(
                        line,
                        format!("unknown state space `.{other}`"),
                    ));
                }
            },
            _ => return Err(LoadError::invalid(line, "expected a state space")),
        };
        let mut align = None;
        let mut vec = 1;
        let mut ty = None;
        let mut managed = false;
        while let Some(d) = self.peek_dot() {
            self.pos += 1;
            match d {
                "align" => align = Some(self.int()?),
                "v2" => vec = 2,
                "v4" => vec = 4,
                "v8" => vec = 8,
                "ptr" | "global" | "const" | "shared" | "local" => {}
                // `.attribute(.managed)` and similar.
                "attribute" => {
                    self.expect_punct('(')?;
                    while !self.eat_punct(')') {
                        match self.next() {
                            None => return Err(self.err("unterminated .attribute")),
                            Some(Tok::Dot(a)) if a == "managed" => managed = true,
                            Some(_) => {}
                        }
                    }
                }
                t => ty = Some(t.to_string()),
            }
        }
        let ty =
            ty.ok_or_else(|| LoadError::invalid(line, "variable declaration without a type"))?;
        // `_`: an unnamed parameter of a call prototype.
        let name = if self.eat_punct('_') {
            "_".to_string()
        } else {
            self.ident()?
        };
        let mut dims = Vec::new();
        while self.eat_punct('[') {
            if self.eat_punct(']') {
                dims.push(None);
            } else {
                let n = self.int()?;
                self.expect_punct(']')?;
                dims.push(Some(n));
            }
        }
        let init = if self.eat_punct('=') {
            Some(self.init(depth)?)
        } else {
            None
        };
        Ok(VarDecl {
            line,
            space,
            is_extern: false,
            align,
            vec,
            ty,
            name,
            dims,
            init,
            managed,
        })
    }

    fn init(&mut self, depth: usize) -> Result<Init, LoadError> {
        if depth > MAX_NESTING {
            return Err(self.err("initializer nested too deeply"));
        }
        if self.eat_punct('{') {
            let mut items = Vec::new();
            if !self.eat_punct('}') {
                loop {
                    items.push(self.init(depth + 1)?);
                    if self.eat_punct('}') {
                        break;
                    }
                    self.expect_punct(',')?;
                }
            }
            return Ok(Init::List(items));
        }
        let neg = self.eat_punct('-');
        let lit = match self.next() {
            Some(Tok::Int(v)) => Lit::Int(if neg { v.wrapping_neg() } else { *v }),
            Some(Tok::F32(b)) => Lit::F32(if neg { b ^ 0x8000_0000 } else { *b }),
            Some(Tok::F64(b)) => Lit::F64(if neg { b ^ (1 << 63) } else { *b }),
            Some(Tok::Ident(s)) if !neg => {
                let (name, off) = if (s == "generic" || s == "global") && self.eat_punct('(') {
                    let n = self.ident()?;
                    self.expect_punct(')')?;
                    (n, 0i64)
                } else {
                    (s.clone(), 0)
                };
                let off = if self.eat_punct('+') {
                    off.wrapping_add(self.int()? as i64)
                } else {
                    off
                };
                Lit::Sym(name, off)
            }
            _ => {
                self.pos = self.pos.saturating_sub(1);
                return Err(self.err(format!("bad initializer value {}", self.describe())));
            }
        };
        Ok(Init::Scalar(lit))
    }

    fn param_list(&mut self) -> Result<Vec<VarDecl>, LoadError> {
        self.expect_punct('(')?;
        let mut out = Vec::new();
        if self.eat_punct(')') {
            return Ok(out);
        }
        loop {
            out.push(self.var_decl(0)?);
            if self.eat_punct(')') {
                return Ok(out);
            }
            self.expect_punct(',')?;
        }
    }

    fn function(&mut self) -> Result<FuncDecl, LoadError> {
        let line = self.line();
        let is_entry = self.peek_dot() == Some("entry");
        self.pos += 1;
        let mut rets = Vec::new();
        if !is_entry && self.peek() == Some(&Tok::Punct('(')) {
            rets = self.param_list()?;
        }
        let name = self.ident()?;
        let mut params = Vec::new();
        if self.peek() == Some(&Tok::Punct('(')) {
            params = self.param_list()?;
        }
        let mut perf = Vec::new();
        loop {
            match self.peek_dot() {
                Some("pragma") => {
                    self.pos += 1;
                    self.skip_to_semicolon()?;
                }
                Some(d) => {
                    self.pos += 1;
                    let mut nums = Vec::new();
                    while let Some(Tok::Int(v)) = self.peek() {
                        nums.push(*v);
                        self.pos += 1;
                        if !self.eat_punct(',') {
                            break;
                        }
                    }
                    perf.push((d.to_string(), nums));
                }
                None => break,
            }
        }
        if self.eat_punct(';') {
            return Ok(FuncDecl {
                line,
                is_entry,
                name,
                rets,
                params,
                perf,
                body: None,
            });
        }
        let body = self.body()?;
        Ok(FuncDecl {
            line,
            is_entry,
            name,
            rets,
            params,
            perf,
            body: Some(body),
        })
    }

    fn body(&mut self) -> Result<Vec<Stmt>, LoadError> {
        self.expect_punct('{')?;
        let mut out = Vec::new();
        let mut depth = 1usize;
        loop {
            let line = self.line();
            self.ticker.tick(1, line)?;
            match self.peek() {
                None => return Err(self.err("unterminated function body")),
                Some(Tok::Punct('{')) => {
                    self.pos += 1;
                    depth += 1;
                    if depth > MAX_NESTING {
                        return Err(LoadError::invalid(line, "blocks nested too deeply"));
                    }
                    out.push(Stmt::Open);
                }
                Some(Tok::Punct('}')) => {
                    self.pos += 1;
                    depth -= 1;
                    if depth == 0 {
                        return Ok(out);
                    }
                    out.push(Stmt::Close);
                }
                Some(Tok::Punct(';')) => self.pos += 1,
                Some(Tok::Dot(d)) => match d.as_str() {
                    "reg" => {
                        self.pos += 1;
                        let mut ty = None;
                        while let Some(d) = self.peek_dot() {
                            self.pos += 1;
                            if !matches!(d, "v2" | "v4") {
                                ty = Some(d.to_string());
                            }
                        }
                        let ty =
                            ty.ok_or_else(|| LoadError::invalid(line, ".reg without a type"))?;
                        let mut names = Vec::new();
                        loop {
                            let n = self.ident()?;
                            if self.eat_punct('<') {
                                let count = self.int()?;
                                self.expect_punct('>')?;
                                let count = u32::try_from(count).map_err(|_| {
                                    LoadError::invalid(line, "register range too large")
                                })?;
                                names.push(RegName::Range(n, count));
                            } else {
                                names.push(RegName::One(n));
                            }
                            if !self.eat_punct(',') {
                                break;
                            }
                        }
                        self.expect_punct(';')?;
                        out.push(Stmt::Reg { line, ty, names });
                    }
                    "shared" | "local" | "param" | "global" | "const" => {
                        let v = self.var_decl(0)?;
                        self.expect_punct(';')?;
                        out.push(Stmt::Var(v));
                    }
                    "pragma" => {
                        self.pos += 1;
                        self.skip_to_semicolon()?;
                    }
                    "loc" | "file" => {
                        self.pos += 1;
                        self.skip_line(line);
                    }
                    "section" => {
                        self.pos += 1;
                        while !matches!(self.peek(), Some(Tok::Punct('{')) | None) {
                            self.pos += 1;
                        }
                        self.skip_braces()?;
                    }
                    other => {
                        return Err(LoadError::invalid(
                            line,
                            format!("unexpected directive `.{other}` in a function body"),
                        ));
                    }
                },
                Some(Tok::Ident(name)) if self.peek_at(1) == Some(&Tok::Punct(':')) => {
                    self.pos += 2;
                    match self.peek_dot() {
                        // `name: .callprototype (.param .b32 _) _ (.param .b64 _, ...);`: the
                        // signature of the indirect calls that name it.
                        Some("callprototype") => {
                            self.pos += 1;
                            let rets = if self.peek() == Some(&Tok::Punct('(')) {
                                self.param_list()?
                            } else {
                                Vec::new()
                            };
                            if !self.eat_punct('_') {
                                self.ident()?;
                            }
                            let params = if self.peek() == Some(&Tok::Punct('(')) {
                                self.param_list()?
                            } else {
                                Vec::new()
                            };
                            self.expect_punct(';')?;
                            out.push(Stmt::Prototype {
                                line,
                                name: name.clone(),
                                rets,
                                params,
                            });
                        }
                        // `.calltargets` lists: only a hint to the compiler.
                        Some("calltargets") => self.skip_to_semicolon()?,
                        _ => out.push(Stmt::Label {
                            line,
                            name: name.clone(),
                        }),
                    }
                }
                Some(Tok::Ident(_)) | Some(Tok::Punct('@')) => {
                    out.push(Stmt::Inst(self.instruction()?))
                }
                Some(_) => {
                    return Err(
                        self.err(format!("unexpected {} in a function body", self.describe()))
                    );
                }
            }
        }
    }

    fn instruction(&mut self) -> Result<Instr, LoadError> {
        let line = self.line();
        let guard = if self.eat_punct('@') {
            let neg = self.eat_punct('!');
            Some((neg, self.ident()?))
        } else {
            None
        };
        let opcode = self.ident()?;
        let mut mods = Vec::new();
        while let Some(d) = self.peek_dot() {
            mods.push(d.to_string());
            self.pos += 1;
        }
        let mut operands = Vec::new();
        if !self.eat_punct(';') {
            loop {
                operands.push(self.operand(0)?);
                if self.eat_punct(';') {
                    break;
                }
                self.expect_punct(',')?;
            }
        }
        Ok(Instr {
            line,
            guard,
            opcode,
            mods,
            operands,
        })
    }

    fn name_with_component(&mut self, base: String) -> String {
        if let Some(c @ ("x" | "y" | "z" | "w" | "r" | "g" | "b" | "a")) = self.peek_dot() {
            self.pos += 1;
            format!("{base}.{c}")
        } else {
            base
        }
    }

    fn operand(&mut self, depth: usize) -> Result<Operand, LoadError> {
        if depth > MAX_NESTING {
            return Err(self.err("operand nested too deeply"));
        }
        let line = self.line();
        match self.next() {
            // PTX's run-time constant for the warp size, allowed wherever an immediate is.
            Some(Tok::Ident(s)) if s == "WARP_SZ" => Ok(Operand::Int(crate::WARP_SIZE)),
            Some(Tok::Ident(s)) => {
                let s = self.name_with_component(s.clone());
                if let Some(part) = self.peek_dot().filter(|p| is_part_selector(p)) {
                    self.pos += 1;
                    return Ok(Operand::Part(s, part.to_string()));
                }
                if self.eat_punct('|') {
                    let q = self.ident()?;
                    return Ok(Operand::Pair(s, q));
                }
                if self.peek() == Some(&Tok::Punct('+')) {
                    // `sym+off` outside brackets (address of a variable plus an offset).
                    self.pos += 1;
                    let off = self.signed_int()?;
                    return Ok(Operand::SymOff(s, off));
                }
                Ok(Operand::Name(s))
            }
            Some(Tok::Punct('!')) => {
                let s = self.ident()?;
                Ok(Operand::NotName(s))
            }
            Some(Tok::Punct('_')) => Ok(Operand::Sink),
            Some(Tok::Punct('-')) if matches!(self.peek(), Some(Tok::Ident(_))) => {
                Ok(Operand::Neg(Box::new(self.operand(depth + 1)?)))
            }
            Some(Tok::Punct('-')) => match self.next() {
                Some(Tok::Int(v)) => Ok(Operand::Int(v.wrapping_neg())),
                Some(Tok::F64(b)) => Ok(Operand::F64(b ^ (1 << 63))),
                Some(Tok::F32(b)) => Ok(Operand::F32(b ^ 0x8000_0000)),
                _ => Err(LoadError::invalid(line, "expected a number after `-`")),
            },
            Some(Tok::Int(v)) => Ok(Operand::Int(*v)),
            Some(Tok::F32(b)) => Ok(Operand::F32(*b)),
            Some(Tok::F64(b)) => Ok(Operand::F64(*b)),
            Some(Tok::Punct('[')) => {
                let (base, off) = match self.peek() {
                    Some(Tok::Ident(s)) if self.peek_at(1) == Some(&Tok::Punct(',')) => {
                        // `[handle, {coords}]` of a texture or surface instruction.
                        let s = s.clone();
                        self.pos += 1;
                        let mut rest = Vec::new();
                        while self.eat_punct(',') {
                            rest.push(self.operand(depth + 1)?);
                        }
                        self.expect_punct(']')?;
                        return Ok(Operand::Tex(s, rest));
                    }
                    Some(Tok::Ident(s)) => {
                        let s = s.clone();
                        self.pos += 1;
                        let off = if self.eat_punct('+') {
                            self.signed_int()?
                        } else {
                            0
                        };
                        (Some(s), off)
                    }
                    _ => (None, self.signed_int()?),
                };
                self.expect_punct(']')?;
                Ok(Operand::Addr(base, off))
            }
            Some(Tok::Punct('{')) => {
                let mut items = Vec::new();
                loop {
                    items.push(self.operand(depth + 1)?);
                    if self.eat_punct('}') {
                        break;
                    }
                    self.expect_punct(',')?;
                }
                Ok(Operand::Vec(items))
            }
            Some(Tok::Punct('(')) => {
                let mut items = Vec::new();
                if !self.eat_punct(')') {
                    loop {
                        items.push(self.operand(depth + 1)?);
                        if self.eat_punct(')') {
                            break;
                        }
                        self.expect_punct(',')?;
                    }
                }
                Ok(Operand::List(items))
            }
            _ => {
                self.pos = self.pos.saturating_sub(1);
                Err(self.err(format!("expected an operand, found {}", self.describe())))
            }
        }
    }

    fn signed_int(&mut self) -> Result<i64, LoadError> {
        let neg = self.eat_punct('-');
        let v = self.int()? as i64;
        Ok(if neg { v.wrapping_neg() } else { v })
    }
}

/// Parses PTX tokens into a module syntax tree.
#[cfg(test)]
pub(crate) fn parse(toks: &[Token]) -> Result<Ast, LoadError> {
    parse_watched(toks, &mut Ticker::none())
}

/// [`parse`], asking `ticker` whether to go on as it goes.
pub(crate) fn parse_watched(toks: &[Token], ticker: &mut Ticker<'_>) -> Result<Ast, LoadError> {
    Parser {
        toks,
        pos: 0,
        ticker,
    }
    .module()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lexer::tokenize;

    fn parse_str(s: &str) -> Result<Ast, LoadError> {
        parse(&tokenize(s)?)
    }

    #[test]
    fn parses_module_structure() {
        let ast = parse_str(
            r#"
.version 8.8
.target sm_90
.address_size 64
.global .align 4 .b8 table[8] = {1, 0, 0, 0, 2, 0, 0, 0};
.extern .shared .align 16 .b8 s[];
.visible .entry k(.param .u64 k_param_0, .param .align 8 .b8 k_param_1[16]) .maxntid 128, 1, 1
{
    .reg .pred %p<2>;
    .reg .b32 %r<3>, %x;
    @!%p1 bra $L__BB0_2;
    ld.global.v2.f32 {%f1, _}, [%rd1+-8];
    setp.lt.s32 %p0|%p1, %r1, -4;
$L__BB0_2:
    call.uni (retval0), f, (param0, param1);
    ret;
}
"#,
        )
        .unwrap();
        assert_eq!(ast.version, (8, 8));
        assert_eq!(ast.target, vec!["sm_90".to_string()]);
        assert_eq!(ast.items.len(), 3);
        let Item::Func(f) = &ast.items[2] else {
            panic!("not a function")
        };
        assert!(f.is_entry);
        assert_eq!(f.params.len(), 2);
        assert_eq!(f.params[1].dims, vec![Some(16)]);
        assert_eq!(f.perf, vec![("maxntid".to_string(), vec![128, 1, 1])]);
        let body = f.body.as_ref().unwrap();
        let insts: Vec<&Instr> = body
            .iter()
            .filter_map(|s| if let Stmt::Inst(i) = s { Some(i) } else { None })
            .collect();
        assert_eq!(insts.len(), 5);
        assert_eq!(insts[0].guard, Some((true, "%p1".to_string())));
        assert_eq!(insts[1].full_name(), "ld.global.v2.f32");
        assert!(matches!(insts[1].operands[1], Operand::Addr(Some(_), -8)));
        assert!(matches!(insts[2].operands[0], Operand::Pair(_, _)));
        assert!(matches!(insts[2].operands[2], Operand::Int(v) if v == (-4i64) as u64));
        assert_eq!(insts[1].line, 12);
    }

    #[test]
    fn rejects_garbage_with_line() {
        let e = parse_str(".version 8.8\n.entry k(\n{ ret; }").unwrap_err();
        assert_eq!(e.line, 3);
        let deep = format!(
            ".global .b8 x[1] = {}1{};",
            "{".repeat(200),
            "}".repeat(200)
        );
        assert!(parse_str(&deep).is_err());
    }
}
