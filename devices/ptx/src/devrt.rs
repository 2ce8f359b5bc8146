//! The device runtime's system calls that CUDA's `libcudadevrt` makes for cooperative groups:
//! `cudaCGGetIntrinsicHandle` and `cudaCGSynchronize`/`cudaCGSynchronizeGrid` (which numba
//! calls for `cg.this_grid().sync()`, and which a linker takes from `libcudadevrt.a`) call
//! `__cuda_syscall_CGS_get_intrinsic_handle` and `__cuda_syscall_CGS_sync`, which NVIDIA's
//! driver supplies at load. The simulated GPU supplies them as PTX ([`with_syscalls`]): the
//! handle is a cooperative launch's grid workspace (`%envreg1`/`%envreg2`, 0 for an ordinary
//! launch, where the library then reports an error instead of waiting), and the barrier is the
//! one nvcc inlines for `grid.sync()` on that workspace.

use std::borrow::Cow;

/// `__cuda_syscall_CGS_get_intrinsic_handle(scope)`: the grid workspace.
const GET_HANDLE: &str = "__cuda_syscall_CGS_get_intrinsic_handle";
/// `__cuda_syscall_CGS_sync(handle, flags)`: a grid-wide barrier; with flag 1 one thread per
/// block calls it (and the caller synchronizes its block), else every thread does. Each way
/// is a path of its own, so that the threads that skip the arrival meet the lead thread at the
/// block barrier where their paths join (a barrier in divergent code would never complete).
const SYNC: &str = "__cuda_syscall_CGS_sync";

/// Their definitions, each on one line (so that a declaration replaced by one keeps the
/// module's line numbers when it took one line).
const GET_HANDLE_PTX: &str = ".func (.param .b64 __cgs_r) __cuda_syscall_CGS_get_intrinsic_handle(.param .b32 __cgs_scope) { .reg .b32 %__cgs_hi, %__cgs_lo; .reg .b64 %__cgs_h; mov.u32 %__cgs_hi, %envreg1; mov.u32 %__cgs_lo, %envreg2; mov.b64 %__cgs_h, {%__cgs_lo, %__cgs_hi}; st.param.b64 [__cgs_r], %__cgs_h; ret; }";
const SYNC_PTX: &str = ".func (.param .b32 __cgs_r) __cuda_syscall_CGS_sync(.param .b64 __cgs_h, .param .b32 __cgs_flags) { .reg .pred %__cgs_one, %__cgs_rest, %__cgs_master, %__cgs_wait; .reg .b32 %__cgs_f, %__cgs_a, %__cgs_b, %__cgs_c, %__cgs_n, %__cgs_add, %__cgs_old, %__cgs_cur; .reg .b64 %__cgs_p; ld.param.u64 %__cgs_p, [__cgs_h]; ld.param.u32 %__cgs_f, [__cgs_flags]; and.b32 %__cgs_f, %__cgs_f, 1; setp.ne.u32 %__cgs_one, %__cgs_f, 0; @%__cgs_one bra __CGS_ONE; bar.sync 0; mov.u32 %__cgs_a, %tid.x; mov.u32 %__cgs_b, %tid.y; mov.u32 %__cgs_c, %tid.z; or.b32 %__cgs_a, %__cgs_a, %__cgs_b; or.b32 %__cgs_a, %__cgs_a, %__cgs_c; setp.ne.u32 %__cgs_rest, %__cgs_a, 0; @%__cgs_rest bra __CGS_ALL_DONE; mov.u32 %__cgs_a, %nctaid.x; mov.u32 %__cgs_b, %nctaid.y; mov.u32 %__cgs_c, %nctaid.z; mul.lo.u32 %__cgs_n, %__cgs_a, %__cgs_b; mul.lo.u32 %__cgs_n, %__cgs_n, %__cgs_c; mov.u32 %__cgs_a, %ctaid.x; mov.u32 %__cgs_b, %ctaid.y; mov.u32 %__cgs_c, %ctaid.z; or.b32 %__cgs_a, %__cgs_a, %__cgs_b; or.b32 %__cgs_a, %__cgs_a, %__cgs_c; setp.eq.u32 %__cgs_master, %__cgs_a, 0; mov.u32 %__cgs_add, -2147483647; sub.u32 %__cgs_add, %__cgs_add, %__cgs_n; selp.u32 %__cgs_add, %__cgs_add, 1, %__cgs_master; membar.gl; atom.add.release.gpu.u32 %__cgs_old, [%__cgs_p], %__cgs_add; __CGS_ALL_SPIN: ld.acquire.gpu.u32 %__cgs_cur, [%__cgs_p]; xor.b32 %__cgs_cur, %__cgs_cur, %__cgs_old; setp.gt.s32 %__cgs_wait, %__cgs_cur, -1; @%__cgs_wait bra __CGS_ALL_SPIN; __CGS_ALL_DONE: bar.sync 0; bra.uni __CGS_RET; __CGS_ONE: mov.u32 %__cgs_a, %nctaid.x; mov.u32 %__cgs_b, %nctaid.y; mov.u32 %__cgs_c, %nctaid.z; mul.lo.u32 %__cgs_n, %__cgs_a, %__cgs_b; mul.lo.u32 %__cgs_n, %__cgs_n, %__cgs_c; mov.u32 %__cgs_a, %ctaid.x; mov.u32 %__cgs_b, %ctaid.y; mov.u32 %__cgs_c, %ctaid.z; or.b32 %__cgs_a, %__cgs_a, %__cgs_b; or.b32 %__cgs_a, %__cgs_a, %__cgs_c; setp.eq.u32 %__cgs_master, %__cgs_a, 0; mov.u32 %__cgs_add, -2147483647; sub.u32 %__cgs_add, %__cgs_add, %__cgs_n; selp.u32 %__cgs_add, %__cgs_add, 1, %__cgs_master; membar.gl; atom.add.release.gpu.u32 %__cgs_old, [%__cgs_p], %__cgs_add; __CGS_ONE_SPIN: ld.acquire.gpu.u32 %__cgs_cur, [%__cgs_p]; xor.b32 %__cgs_cur, %__cgs_cur, %__cgs_old; setp.gt.s32 %__cgs_wait, %__cgs_cur, -1; @%__cgs_wait bra __CGS_ONE_SPIN; __CGS_RET: mov.u32 %__cgs_f, 0; st.param.b32 [__cgs_r], %__cgs_f; ret; }";

/// `ptx` with each `.extern` declaration of a system call above replaced by its definition
/// (the first; later ones removed), and as many line breaks as the declaration had; unchanged
/// (and not copied) when it declares none. One pass over the text, whatever it declares: it is
/// a guest's module.
pub(crate) fn with_syscalls(ptx: &str) -> Cow<'_, str> {
    if !ptx.contains("__cuda_syscall_CGS_") {
        return Cow::Borrowed(ptx);
    }
    let calls = [(GET_HANDLE, GET_HANDLE_PTX), (SYNC, SYNC_PTX)];
    let mut defined = [false; 2];
    let mut out = String::with_capacity(ptx.len() + GET_HANDLE_PTX.len() + SYNC_PTX.len());
    let (mut copied, mut from) = (0, 0);
    while let Some(at) = ptx[from..].find(".extern") {
        let start = from + at;
        let Some(semicolon) = ptx[start..].find(';') else {
            break;
        };
        let end = start + semicolon + 1;
        let decl = &ptx[start..end];
        if let Some(i) = calls.iter().position(|&(name, _)| declares(decl, name)) {
            out.push_str(&ptx[copied..start]);
            if !std::mem::replace(&mut defined[i], true) {
                out.push_str(calls[i].1);
            }
            out.extend(std::iter::repeat_n('\n', decl.matches('\n').count()));
            copied = end;
        }
        // Every `.extern` up to this `;` belongs to this statement.
        from = end;
    }
    out.push_str(&ptx[copied..]);
    Cow::Owned(out)
}

/// Whether `decl` (an `.extern` statement up to its `;`) declares function `name`.
fn declares(decl: &str, name: &str) -> bool {
    let named = decl.match_indices(name).any(|(i, _)| {
        let after = decl[i + name.len()..].trim_start();
        let before = decl[..i].chars().last();
        after.starts_with('(') && before.is_some_and(|c| c.is_whitespace() || c == ')')
    });
    named && decl.contains(".func") && !decl.contains('{')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_become_definitions_and_lines_stay_put() {
        let ptx = ".version 7.8\n.target sm_80\n.address_size 64\n\
            .extern .func (.param .b32 func_retval0) __cuda_syscall_CGS_sync\n(\n.param .b64 param0,\n.param .b32 param1\n)\n;\n\
            .extern .func (.param .b64 r) __cuda_syscall_CGS_get_intrinsic_handle(.param .b32 p);\n\
            .extern .func (.param .b32 func_retval0) __cuda_syscall_CGS_sync(.param .b64 a, .param .b32 b);\n\
            .visible .func f() { ret; }\n";
        let out = with_syscalls(ptx);
        assert_eq!(out.lines().count(), ptx.lines().count());
        assert_eq!(out.matches("__cuda_syscall_CGS_sync(").count(), 1);
        assert!(!out.contains(".extern"));
        let line = |s: &str, needle: &str| s.lines().position(|l| l.contains(needle));
        assert_eq!(
            line(&out, ".visible .func f"),
            line(ptx, ".visible .func f")
        );
        assert!(matches!(
            with_syscalls(".visible .func f() { ret; }"),
            Cow::Borrowed(_)
        ));
    }
}
