//! The message table of docs/protocol.md, generated from [`crate::msg::OPS`].
//! A test keeps the document and the code in step (`VGPU_BLESS=1 cargo test
//! -p vgpu-proto` rewrites the table after a protocol change).

use std::fmt::Write;

use crate::msg::{ASYNC_OK, Field, OPS, REPLY_TAIL, REQ_TAIL};

/// Marker before the generated table.
pub const BEGIN: &str = "<!-- BEGIN GENERATED: ops table (proto/src/spec.rs) -->";
/// Marker after the generated table.
pub const END: &str = "<!-- END GENERATED -->";

fn fields(f: &[Field], tail: bool) -> String {
    let mut v: Vec<String> = f
        .iter()
        .map(|f| format!("`{}: {}`", f.name, f.ty))
        .collect();
    if tail {
        v.push("bulk bytes".into());
    }
    if v.is_empty() {
        "—".into()
    } else {
        v.join(", ")
    }
}

/// The markdown table of every op.
pub fn ops_table() -> String {
    let mut s = String::new();
    s.push_str("| opcode | op | request payload | reply payload | async | CUDA entry points |\n");
    s.push_str("|---|---|---|---|---|---|\n");
    for op in OPS {
        let _ = writeln!(
            s,
            "| `{:#06x}` | {} | {} | {}: {} | {} | {} |",
            op.opcode,
            op.name,
            fields(op.request, op.flags & REQ_TAIL != 0),
            op.reply_name,
            fields(op.reply, op.flags & REPLY_TAIL != 0),
            if op.flags & ASYNC_OK != 0 {
                "yes"
            } else {
                "no"
            },
            op.used_by
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_md_lists_every_op_as_the_code_defines_it() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/protocol.md");
        let doc = std::fs::read_to_string(&path).expect("docs/protocol.md exists");
        let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
            panic!("docs/protocol.md lacks the generated-table markers");
        };
        let current = &doc[b + BEGIN.len()..e];
        let want = format!("\n{}", ops_table());
        if current != want {
            if std::env::var_os("VGPU_BLESS").is_some() {
                let new = format!("{}{}{}{}", &doc[..b], BEGIN, want, &doc[e..]);
                std::fs::write(&path, new).expect("rewriting docs/protocol.md");
            } else {
                panic!(
                    "docs/protocol.md's message table is stale: run VGPU_BLESS=1 cargo test -p vgpu-proto"
                );
            }
        }
    }
}
