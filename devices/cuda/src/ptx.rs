//! A scanner for the module-scope declarations of PTX text: kernel entries
//! with their parameter layouts, and `.global` / `.const` variables.
//!
//! The driver compiles the PTX; this only reads what the broker needs and
//! older drivers cannot tell: which kernels exist and how their parameters
//! are packed (CUDA < 12.4 has no `cuFuncGetParamInfo`), and which module
//! variables exist so `cuModuleGetGlobal_v2` can give their addresses for the
//! slice charge (no CUDA version enumerates globals). Statements it does not
//! understand are skipped; function bodies are never parsed.

/// A kernel parameter: where it goes in the packed parameter buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// Byte offset.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
    /// Alignment in bytes.
    pub align: u32,
}

/// A `.entry` declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Entry name.
    pub name: String,
    /// Parameters in declaration order.
    pub params: Vec<Param>,
}

/// State space of a module variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// `.global` (`__device__`).
    Global,
    /// `.const` (`__constant__`).
    Const,
}

/// A module-scope variable definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variable {
    /// Name (what `cuModuleGetGlobal` looks up).
    pub name: String,
    /// Space.
    pub space: Space,
    /// Size in bytes.
    pub size: u64,
    /// Declared `.attribute(.managed)` (`__managed__`).
    pub managed: bool,
}

/// What a PTX module declares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declarations {
    /// Kernels, in order.
    pub entries: Vec<Entry>,
    /// Variables defined at module scope (not `.extern`).
    pub variables: Vec<Variable>,
}

/// Directives that end at the end of their line instead of at a `;`.
const LINE_DIRECTIVES: &[&str] = &[".version", ".target", ".address_size", ".file"];
/// Linkage directives that may precede a declaration.
const LINKAGE: &[&str] = &[".visible", ".extern", ".weak", ".common"];
/// Opaque types with no memory of their own.
const OPAQUE: &[&str] = &[".texref", ".samplerref", ".surfref"];

/// Size in bytes of a PTX fundamental type.
fn type_size(t: &str) -> Option<u64> {
    Some(match t {
        ".b8" | ".u8" | ".s8" | ".pred" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" | ".e4m3x2" | ".e5m2x2" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" | ".tf32" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" => 8,
        ".b128" => 16,
        _ => return None,
    })
}

fn vector_len(t: &str) -> Option<u64> {
    match t {
        ".v2" => Some(2),
        ".v4" => Some(4),
        ".v8" => Some(8),
        _ => None,
    }
}

/// Removes comments and line directives, keeping line structure irrelevant.
fn strip(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            out.push(' ');
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
        } else if let Some(r) = rest.strip_prefix('"') {
            // Strings appear only in .file / .section directives; drop their text.
            out.push_str("\"\"");
            rest = r.find('"').map_or("", |i| &r[i + 1..]);
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out.lines()
        .filter(|l| {
            let first = l.split_whitespace().next().unwrap_or("");
            !LINE_DIRECTIVES.contains(&first)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '%' | '.')
}

fn tokenize(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c.is_whitespace() {
            continue;
        }
        if is_word_char(c) || c == '-' {
            let mut end = i + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if is_word_char(d) {
                    end = j + d.len_utf8();
                    chars.next();
                } else {
                    break;
                }
            }
            out.push(&text[i..end]);
        } else {
            out.push(&text[i..i + c.len_utf8()]);
        }
    }
    out
}

fn parse_u64(t: &str) -> Option<u64> {
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(h.trim_end_matches(['U', 'u']), 16).ok()
    } else {
        t.trim_end_matches(['U', 'u']).parse().ok()
    }
}

/// Splits `tokens` at top-level commas (outside `()`, `[]`, `{}`).
fn split_commas<'a, 'b>(tokens: &'b [&'a str]) -> Vec<&'b [&'a str]> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, t) in tokens.iter().enumerate() {
        match *t {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => depth -= 1,
            "," if depth == 0 => {
                parts.push(&tokens[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < tokens.len() {
        parts.push(&tokens[start..]);
    }
    parts
}

/// Number of scalar items in an initializer (`{1, {2, 3}}` → 3).
fn initializer_items(tokens: &[&str]) -> u64 {
    let inner: Vec<&str> = tokens
        .iter()
        .copied()
        .filter(|t| *t != "{" && *t != "}")
        .collect();
    if inner.is_empty() {
        0
    } else {
        split_commas(&inner).len() as u64
    }
}

/// A declarator `name[d0][d1] = init`: (name, element count).
fn declarator(tokens: &[&str]) -> Option<(String, u64)> {
    let name = tokens.first()?.to_string();
    let eq = tokens.iter().position(|t| *t == "=");
    let dims_end = eq.unwrap_or(tokens.len());
    let mut count = 1u64;
    let mut i = 1;
    while i < dims_end {
        if tokens[i] != "[" {
            return None;
        }
        if tokens.get(i + 1) == Some(&"]") {
            // `name[]`: the initializer gives the length.
            let init = eq.map_or(&[][..], |e| &tokens[e + 1..]);
            count = count.checked_mul(initializer_items(init))?;
            i += 2;
        } else {
            let n = parse_u64(tokens.get(i + 1)?)?;
            if tokens.get(i + 2) != Some(&"]") {
                return None;
            }
            count = count.checked_mul(n)?;
            i += 3;
        }
    }
    Some((name, count))
}

/// Skips `.attribute( … )` groups.
fn without_attributes<'a>(tokens: &[&'a str]) -> Vec<&'a str> {
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == ".attribute" && tokens.get(i + 1) == Some(&"(") {
            let mut depth = 0;
            while i < tokens.len() {
                match tokens[i] {
                    "(" => depth += 1,
                    ")" => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            i += 1;
            continue;
        }
        out.push(tokens[i]);
        i += 1;
    }
    out
}

fn variables(stmt: &[&str], out: &mut Vec<Variable>) {
    let managed = stmt.windows(2).any(|w| w == [".attribute", "("]) && stmt.contains(&".managed");
    let stmt = without_attributes(stmt);
    let mut i = 0;
    let mut external = false;
    while i < stmt.len() && LINKAGE.contains(&stmt[i]) {
        external |= stmt[i] == ".extern";
        i += 1;
    }
    let space = match stmt.get(i) {
        Some(&".global") => Space::Global,
        Some(&".const") => Space::Const,
        _ => return,
    };
    if external {
        return;
    }
    i += 1;
    let mut vector = 1;
    let mut elem = None;
    while i < stmt.len() {
        let t = stmt[i];
        if t == ".align" {
            i += 2;
        } else if let Some(v) = vector_len(t) {
            vector = v;
            i += 1;
        } else if OPAQUE.contains(&t) {
            return;
        } else if let Some(s) = type_size(t) {
            elem = Some(s);
            i += 1;
            break;
        } else if t.starts_with('.') {
            i += 1;
        } else {
            break;
        }
    }
    let Some(elem) = elem else { return };
    for d in split_commas(stmt.get(i..).unwrap_or(&[])) {
        if let Some((name, count)) = declarator(d) {
            let size = count.saturating_mul(elem).saturating_mul(vector);
            out.push(Variable {
                name,
                space,
                size,
                managed,
            });
        }
    }
}

fn param(tokens: &[&str]) -> Option<(Param, u64)> {
    if tokens.first() != Some(&".param") {
        return None;
    }
    let (mut align, mut size, mut vector) = (None, None, 1u64);
    let mut pointer = false;
    let mut i = 1;
    while i < tokens.len() && tokens[i].starts_with('.') {
        let t = tokens[i];
        if t == ".align" {
            let a = parse_u64(tokens.get(i + 1)?)?;
            // After `.ptr`, `.align` is the pointee's alignment.
            if !pointer {
                align = Some(a);
            }
            i += 2;
            continue;
        }
        if t == ".ptr" {
            pointer = true;
        } else if let Some(v) = vector_len(t) {
            vector = v;
        } else if let Some(s) = type_size(t) {
            size = Some(s);
        }
        i += 1;
    }
    let elem = size? * vector;
    let (_, count) = declarator(&tokens[i..])?;
    let size = elem.checked_mul(count)?;
    let align = align.unwrap_or(elem).max(1);
    Some((
        Param {
            offset: 0,
            size: u32::try_from(size).ok()?,
            align: u32::try_from(align).ok()?,
        },
        size,
    ))
}

fn entry(stmt: &[&str]) -> Option<Entry> {
    let at = stmt.iter().position(|t| *t == ".entry")?;
    let name = stmt.get(at + 1)?.to_string();
    let mut params = Vec::new();
    if stmt.get(at + 2) == Some(&"(") {
        let mut depth = 0;
        let mut end = None;
        for (j, t) in stmt.iter().enumerate().skip(at + 2) {
            match *t {
                "(" => depth += 1,
                ")" => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let list = &stmt[at + 3..end?];
        let mut cursor = 0u64;
        for p in split_commas(list) {
            let (mut p, size) = param(p)?;
            let offset = cursor.div_ceil(u64::from(p.align)) * u64::from(p.align);
            p.offset = u32::try_from(offset).ok()?;
            cursor = offset + size;
            params.push(p);
        }
    }
    Some(Entry { name, params })
}

/// Scans PTX text for its kernels and module variables.
pub fn scan(text: &str) -> Declarations {
    let clean = strip(text);
    let tokens = tokenize(&clean);
    let mut out = Declarations::default();
    let mut stmt: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i];
        i += 1;
        match t {
            ";" => {
                if !stmt.contains(&".entry") && !stmt.contains(&".func") {
                    variables(&stmt, &mut out.variables);
                }
                stmt.clear();
            }
            "{" if !stmt.contains(&"=") => {
                // A body (function or .section): skip to its matching brace.
                if let Some(e) = entry(&stmt) {
                    out.entries.push(e);
                }
                stmt.clear();
                let mut depth = 1;
                while i < tokens.len() && depth > 0 {
                    match tokens[i] {
                        "{" => depth += 1,
                        "}" => depth -= 1,
                        _ => {}
                    }
                    i += 1;
                }
            }
            _ => stmt.push(t),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> Vec<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/kernels/ptx");
        let mut v: Vec<(String, String)> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "ptx"))
            .map(|p| {
                (
                    p.file_name().unwrap().to_string_lossy().into_owned(),
                    std::fs::read_to_string(&p).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    }

    /// The scanner agrees with the PTX interpreter's full parser on every
    /// kernel and variable of the corpus (87 NVRTC-compiled fixtures).
    #[test]
    fn the_corpus_fixtures_scan_like_the_full_parser() {
        let all = fixtures();
        assert!(all.len() >= 87, "only {} fixtures", all.len());
        let (mut kernels, mut params, mut vars) = (0, 0, 0);
        for (file, text) in &all {
            let want = vgpu_ptx::Module::load(text).unwrap_or_else(|e| panic!("{file}: {e}"));
            let got = scan(text);
            let names: Vec<&str> = got.entries.iter().map(|e| e.name.as_str()).collect();
            let want_names: Vec<&str> = want.kernels().iter().map(|k| k.name.as_str()).collect();
            assert_eq!(names, want_names, "{file}: kernels");
            for (e, k) in got.entries.iter().zip(want.kernels()) {
                let layout: Vec<(usize, usize, usize)> = e
                    .params
                    .iter()
                    .map(|p| (p.offset as usize, p.size as usize, p.align as usize))
                    .collect();
                let want_layout: Vec<(usize, usize, usize)> = k
                    .params
                    .iter()
                    .map(|p| (p.offset, p.size, p.align))
                    .collect();
                assert_eq!(layout, want_layout, "{file}: {} parameters", k.name);
                params += layout.len();
            }
            let got_vars: Vec<(String, bool, u64)> = got
                .variables
                .iter()
                .map(|v| (v.name.clone(), v.space == Space::Const, v.size))
                .collect();
            let want_vars: Vec<(String, bool, u64)> = want
                .globals()
                .iter()
                .map(|g| {
                    (
                        g.name.clone(),
                        g.space == vgpu_ptx::GlobalSpace::Const,
                        g.size as u64,
                    )
                })
                .collect();
            assert_eq!(got_vars, want_vars, "{file}: variables");
            kernels += got.entries.len();
            vars += got_vars.len();
        }
        // The corpus is not trivial: many kernels, parameters and variables.
        assert!(
            kernels >= 150 && params >= 400 && vars >= 6,
            "{kernels} {params} {vars}"
        );
    }

    /// Every prefix of every corpus fixture scans without panicking, and
    /// never yields more than the whole text declares.
    #[test]
    fn truncated_ptx_never_panics() {
        for (file, text) in fixtures() {
            let whole = scan(&text);
            // About 60 cuts per file, at odd offsets.
            for cut in (0..text.len()).step_by(text.len() / 60 + 1) {
                let d = scan(&text[..cut]);
                assert!(d.entries.len() <= whole.entries.len(), "{file} at {cut}");
                assert!(
                    d.variables.len() <= whole.variables.len(),
                    "{file} at {cut}"
                );
            }
        }
    }

    #[test]
    fn parameters_follow_alignment_rules() {
        let d = scan(
            ".version 8.0\n.target sm_80\n.address_size 64\n\
             .visible .entry k(\n .param .u8 a,\n .param .u64 .ptr .global .align 16 b,\n\
             .param .align 8 .b8 c[12],\n .param .u16 d,\n .param .v2 .f32 e\n)\n\
             .maxntid 128, 1, 1\n{\n ret;\n}\n",
        );
        let p: Vec<(u32, u32, u32)> = d.entries[0]
            .params
            .iter()
            .map(|p| (p.offset, p.size, p.align))
            .collect();
        // b: pointer aligned to its size, not its pointee's 16.
        assert_eq!(
            p,
            [(0, 1, 1), (8, 8, 8), (16, 12, 8), (28, 2, 2), (32, 8, 8)]
        );
    }

    #[test]
    fn variables_with_odd_declarations() {
        let d = scan(
            "/* a\n block */ .version 8.0\n.target sm_80 // c\n\
             .file 1 \"a;b{c}.cu\"\n\
             .extern .global .align 4 .u32 elsewhere;\n\
             .visible .global .align 8 .u64 a, b[3];\n\
             .const .align 4 .b8 table[] = {1, 2, {3, 4}};\n\
             .global .attribute(.managed) .align 4 .u32 managed;\n\
             .global .align 16 .v4 .f32 vec[2];\n\
             .global .texref tex;\n\
             .shared .align 4 .b8 smem[64];\n\
             .func (.param .b32 r) f(.param .b32 x) { .param .b32 inner; ret; }\n\
             .entry bare { ret; }\n",
        );
        let v: Vec<(&str, u64)> = d
            .variables
            .iter()
            .map(|v| (v.name.as_str(), v.size))
            .collect();
        assert_eq!(
            v,
            [
                ("a", 8),
                ("b", 24),
                ("table", 4),
                ("managed", 4),
                ("vec", 32)
            ]
        );
        assert_eq!(d.variables[2].space, Space::Const);
        let managed: Vec<bool> = d.variables.iter().map(|v| v.managed).collect();
        assert_eq!(managed, [false, false, false, true, false]);
        assert_eq!(d.entries.len(), 1);
        assert_eq!(d.entries[0].name, "bare");
        assert!(d.entries[0].params.is_empty());
    }

    #[test]
    fn garbage_yields_nothing_and_never_panics() {
        for text in [
            "",
            "{{{{",
            "}}}} ;;; .entry",
            ".entry (",
            ".global .u32 x[",
            ".global .u32 x[99999999999999999999999];",
            ".global .u32 x[4294967296][4294967296][4294967296];",
            ".entry k(.param .u32 a[0x100000000]) {}",
            ".global .align",
            ".global .align 4",
            ".const .v4",
            ".entry k(.param .align",
            ".entry k(.param .u32 .ptr .align 8",
            "\"unterminated",
            "/* unterminated",
        ] {
            let d = scan(text);
            assert!(d.entries.iter().all(|e| e.params.len() < 2), "{text}");
        }
    }
}
