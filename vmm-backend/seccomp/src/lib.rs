//! Per-thread-kind seccomp allowlists for vgpud.
//!
//! vgpud parses what hostile guests send, so each of its threads runs under a
//! system-call allowlist for its kind, as firecracker and cloud-hypervisor do:
//!
//! - [`ThreadKind::Control`]: the main thread and everything it starts before
//!   it serves (admin API, metrics, listeners, the device engines and their
//!   interpreter workers, and the CUDA driver's own threads). Broad: files,
//!   sockets, `ioctl`; never `execve`, `ptrace`, mounts, namespaces, module
//!   or key management, BPF, perf or clock changes.
//! - [`ThreadKind::Session`]: a thread that decodes one guest's frames
//!   (unix-socket and vsock sessions, virtio-vgpu request workers). No new
//!   sockets except unix ones, no `bind`/`listen`, no `ioctl` beyond
//!   non-blocking mode, files opened read-only or append-only (the audit log).
//! - [`ThreadKind::Vhost`]: a vhost-user device thread (the VMM's protocol,
//!   guest memory, virtqueues). Like a session, plus `accept` on its own
//!   socket and `connect` for vsock ports forwarded to unix sockets.
//!
//! Filters stack: a thread keeps its parent's filter and adds its own, so a
//! session started by a listener runs under both. [`install`] applies the
//! control filter to the calling thread (call it on the main thread before any
//! other thread starts); [`enter`] applies a kind's filter to the calling
//! thread under the installed [`Mode`].
//!
//! With [`Mode::Enforce`] a call outside the list raises `SIGSYS`; the handler
//! names the call and the thread on stderr and aborts the daemon (a thread
//! making an unexpected call is treated as compromised). [`Mode::Log`] lets
//! every call through and has the kernel log the ones outside the list.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use thiserror::Error;

/// How vgpud's filters treat a call outside a thread's allowlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Abort the daemon with a message naming the call (the default).
    Enforce,
    /// Let the call through; the kernel logs it (audit log / `dmesg`).
    Log,
    /// No filters.
    Off,
}

/// The kinds of vgpud thread, each with its own allowlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// Main thread, admin API, metrics, listeners, device engines, CUDA driver threads.
    Control,
    /// Decodes one guest's frames and runs its calls.
    Session,
    /// Serves one vhost-user device (virtqueues, guest memory).
    Vhost,
}

impl ThreadKind {
    /// Every kind, for tests and documentation.
    pub const ALL: [ThreadKind; 3] = [ThreadKind::Control, ThreadKind::Session, ThreadKind::Vhost];

    /// The name used in messages and docs/security.md.
    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Control => "control",
            ThreadKind::Session => "session",
            ThreadKind::Vhost => "vhost",
        }
    }
}

/// Errors building or applying a filter.
#[derive(Debug, Error)]
pub enum Error {
    /// A filter's rules are inconsistent (a bug in this crate).
    #[error("cannot build the {kind} seccomp filter")]
    Build {
        kind: &'static str,
        #[source]
        source: seccompiler::BackendError,
    },
    /// The filter cannot be compiled to BPF.
    #[error("cannot compile the {kind} seccomp filter")]
    Compile {
        kind: &'static str,
        #[source]
        source: seccompiler::BackendError,
    },
    /// The kernel refused the filter.
    #[error(
        "cannot apply the {kind} seccomp filter (does the kernel support seccomp? \
         --seccomp=off runs without filters)"
    )]
    Apply {
        kind: &'static str,
        #[source]
        source: seccompiler::Error,
    },
    /// The `SIGSYS` handler could not be installed.
    #[error("cannot install the SIGSYS handler")]
    Handler(#[source] std::io::Error),
    /// [`install`] ran twice.
    #[error("seccomp filters were already installed")]
    AlreadyInstalled,
}

/// The process-wide policy set by [`install`].
struct Policy {
    mode: Mode,
    /// Whether session threads get their own filter (false with a real GPU).
    confine_sessions: bool,
    session: BpfProgram,
    vhost: BpfProgram,
}

static POLICY: OnceLock<Policy> = OnceLock::new();

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;
#[cfg(target_arch = "riscv64")]
const ARCH: TargetArch = TargetArch::riscv64;

/// Calls every vgpud thread makes: memory, futexes, time, signals, thread
/// start and exit, I/O on descriptors it already holds, polling.
const BASE: &[libc::c_long] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_close,
    libc::SYS_lseek,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_fcntl,
    libc::SYS_futex,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_membarrier,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_getrandom,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_tgkill,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_prctl,
    libc::SYS_getrlimit,
    libc::SYS_prlimit64,
    libc::SYS_ppoll,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd2,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_shutdown,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    libc::SYS_getcwd,
    libc::SYS_uname,
    libc::SYS_sysinfo,
    libc::SYS_restart_syscall,
    // Adding a filter only narrows what a thread may do.
    libc::SYS_seccomp,
];

/// x86-64 only forms of the calls above that libc and std still use.
#[cfg(target_arch = "x86_64")]
const BASE_LEGACY: &[libc::c_long] = &[
    libc::SYS_poll,
    libc::SYS_epoll_wait,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_access,
    libc::SYS_dup2,
    libc::SYS_arch_prctl,
];
#[cfg(not(target_arch = "x86_64"))]
const BASE_LEGACY: &[libc::c_long] = &[];

/// What only control threads may do beyond [`BASE`]: create and remove files
/// and sockets, bind and listen, change owners and modes, open a signalfd,
/// `ioctl` (terminals, GPUs, VFIO), the CUDA driver's memory and scheduling calls.
const CONTROL: &[libc::c_long] = &[
    libc::SYS_openat,
    libc::SYS_unlinkat,
    libc::SYS_mkdirat,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_getdents64,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_flock,
    libc::SYS_umask,
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_ioctl,
    libc::SYS_pipe2,
    libc::SYS_close_range,
    libc::SYS_signalfd4,
    libc::SYS_memfd_create,
    libc::SYS_mlock,
    libc::SYS_munlock,
    libc::SYS_mincore,
    libc::SYS_get_mempolicy,
    libc::SYS_set_mempolicy,
    libc::SYS_mbind,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_getparam,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_getpriority,
    libc::SYS_setpriority,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    libc::SYS_inotify_init1,
    libc::SYS_inotify_add_watch,
    libc::SYS_inotify_rm_watch,
    libc::SYS_getppid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    libc::SYS_set_tid_address,
    libc::SYS_wait4,
    libc::SYS_waitid,
    // NVIDIA's user-space libraries link /dev/char entries to their device nodes.
    libc::SYS_symlinkat,
    libc::SYS_mknodat,
];

/// x86-64 only forms of [`CONTROL`] calls.
#[cfg(target_arch = "x86_64")]
const CONTROL_LEGACY: &[libc::c_long] = &[
    libc::SYS_open,
    libc::SYS_unlink,
    libc::SYS_mkdir,
    libc::SYS_chmod,
    libc::SYS_chown,
    libc::SYS_pipe,
    libc::SYS_getdents,
    libc::SYS_symlink,
    libc::SYS_mknod,
];
#[cfg(not(target_arch = "x86_64"))]
const CONTROL_LEGACY: &[libc::c_long] = &[];

/// What vhost-user threads may do beyond [`BASE`]: accept the VMM on their
/// socket, and reach the unix sockets that forwarded vsock ports end in.
/// It also removes its sockets when it stops, and runs the vsock device's
/// wake-up audit on a timer.
const VHOST: &[libc::c_long] = &[
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_unlinkat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_unlink,
];

/// Flags a session or vhost thread may not pass to `openat`: it may read
/// files (std reads `/proc` and cgroup files) and append to the audit log.
const OPEN_FORBIDDEN_FLAGS: u64 = (libc::O_RDWR | libc::O_TRUNC | libc::O_DIRECTORY) as u64;

/// `ioctl` requests a session or vhost thread may make (non-blocking mode and
/// readable byte counts on its own descriptors).
const DATA_IOCTLS: &[u64] = &[libc::FIONBIO, libc::FIONREAD];

fn cond(index: u8, op: SeccompCmpOp, value: u64) -> SeccompCondition {
    SeccompCondition::new(index, SeccompCmpArgLen::Qword, op, value)
        .expect("argument index below 6")
}

/// The rules of `kind`'s allowlist.
fn rules(kind: ThreadKind) -> BTreeMap<i64, Vec<SeccompRule>> {
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let allow_all = |map: &mut BTreeMap<i64, Vec<SeccompRule>>, calls: &[libc::c_long]| {
        for &nr in calls {
            map.insert(nr, Vec::new());
        }
    };
    allow_all(&mut map, BASE);
    allow_all(&mut map, BASE_LEGACY);
    match kind {
        ThreadKind::Control => {
            allow_all(&mut map, CONTROL);
            allow_all(&mut map, CONTROL_LEGACY);
        }
        ThreadKind::Session | ThreadKind::Vhost => {
            if kind == ThreadKind::Vhost {
                allow_all(&mut map, VHOST);
            }
            // openat(dirfd, path, flags, mode): no read-write, truncation or directories.
            let open = SeccompRule::new(vec![cond(
                2,
                SeccompCmpOp::MaskedEq(OPEN_FORBIDDEN_FLAGS),
                0,
            )])
            .expect("one condition");
            map.insert(libc::SYS_openat, vec![open]);
            let ioctls = DATA_IOCTLS
                .iter()
                .map(|&req| {
                    SeccompRule::new(vec![cond(1, SeccompCmpOp::Eq, req)]).expect("one condition")
                })
                .collect();
            map.insert(libc::SYS_ioctl, ioctls);
            // socket(AF_UNIX, …) only: a forwarded vsock port, a session's peer.
            for call in [libc::SYS_socket, libc::SYS_socketpair] {
                let unix = SeccompRule::new(vec![cond(0, SeccompCmpOp::Eq, libc::AF_UNIX as u64)])
                    .expect("one condition");
                map.insert(call, vec![unix]);
            }
        }
    }
    map
}

/// `kind`'s allowlist compiled to BPF; calls outside it get `mismatch`.
pub fn filter(kind: ThreadKind, mismatch: SeccompAction) -> Result<BpfProgram, Error> {
    let filter = SeccompFilter::new(rules(kind), mismatch, SeccompAction::Allow, ARCH).map_err(
        |source| Error::Build {
            kind: kind.name(),
            source,
        },
    )?;
    filter.try_into().map_err(|source| Error::Compile {
        kind: kind.name(),
        source,
    })
}

/// Calls no vgpud thread makes, even with the CUDA driver loaded: running
/// programs, tracing, mounts and namespaces, kernel modules, BPF, perf, keys,
/// clocks, credentials, reboot.
pub const DRIVER_DENIED: &[libc::c_long] = &[
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_setns,
    libc::SYS_unshare,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_syslog,
    libc::SYS_acct,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_personality,
    libc::SYS_userfaultfd,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_setgroups,
    libc::SYS_capset,
    libc::SYS_quotactl,
    libc::SYS_fanotify_init,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_fork,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_vfork,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// The control filter when the CUDA driver is loaded: everything but
/// [`DRIVER_DENIED`], which gets `denied`.
fn denylist(denied: &SeccompAction) -> Result<BpfProgram, Error> {
    let rules = DRIVER_DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, denied.clone(), ARCH).map_err(
        |source| Error::Build {
            kind: "control (real GPU)",
            source,
        },
    )?;
    filter.try_into().map_err(|source| Error::Compile {
        kind: "control (real GPU)",
        source,
    })
}

/// The action for calls outside the list under `mode` (`None`: no filter).
fn mismatch_action(mode: Mode) -> Option<SeccompAction> {
    match mode {
        Mode::Enforce => Some(SeccompAction::Trap),
        Mode::Log => Some(SeccompAction::Log),
        Mode::Off => None,
    }
}

fn apply(kind: ThreadKind, program: &BpfProgram) -> Result<(), Error> {
    seccompiler::apply_filter(program).map_err(|source| Error::Apply {
        kind: kind.name(),
        source,
    })
}

/// Sets the process-wide mode, installs the `SIGSYS` handler and applies the
/// control filter to the calling thread. Call once, on the main thread, before
/// any other thread starts, so that every thread runs at least under the
/// control filter.
///
/// `real_gpu` says a CUDA device is configured. The CUDA driver runs in the
/// threads that call it (sessions, engines) and makes calls that cannot be
/// enumerated without a GPU, so then the control filter is [`DRIVER_DENIED`]
/// (a denylist) instead of the control allowlist, and sessions add no filter
/// of their own. Vhost threads, which never call the driver, keep theirs.
pub fn install(mode: Mode, real_gpu: bool) -> Result<(), Error> {
    let confine_sessions = !real_gpu;
    let Some(mismatch) = mismatch_action(mode) else {
        POLICY
            .set(Policy {
                mode,
                confine_sessions,
                session: Vec::new(),
                vhost: Vec::new(),
            })
            .map_err(|_| Error::AlreadyInstalled)?;
        return Ok(());
    };
    let control = if real_gpu {
        denylist(&mismatch)?
    } else {
        filter(ThreadKind::Control, mismatch.clone())?
    };
    let policy = Policy {
        mode,
        confine_sessions,
        session: filter(ThreadKind::Session, mismatch.clone())?,
        vhost: filter(ThreadKind::Vhost, mismatch)?,
    };
    if mode == Mode::Enforce {
        install_sigsys_handler()?;
    }
    POLICY.set(policy).map_err(|_| Error::AlreadyInstalled)?;
    apply(ThreadKind::Control, &control)?;
    tracing::info!(mode = ?mode, real_gpu, "seccomp filters installed");
    Ok(())
}

/// The mode [`install`] set, if it ran.
pub fn mode() -> Option<Mode> {
    POLICY.get().map(|p| p.mode)
}

/// Applies `kind`'s filter to the calling thread, on top of what it inherited.
/// Does nothing when [`install`] has not run (tests, embedders) or the mode is
/// [`Mode::Off`], for [`ThreadKind::Control`] (every thread already has it),
/// and for sessions when [`install`] was told not to confine them.
pub fn enter(kind: ThreadKind) -> Result<(), Error> {
    let Some(policy) = POLICY.get() else {
        return Ok(());
    };
    let program = match kind {
        _ if policy.mode == Mode::Off => return Ok(()),
        ThreadKind::Control => return Ok(()),
        ThreadKind::Session if !policy.confine_sessions => return Ok(()),
        ThreadKind::Session => &policy.session,
        ThreadKind::Vhost => &policy.vhost,
    };
    apply(kind, program)
}

/// Whether a vhost thread may run a session's calls itself (the virtio-vgpu device's queue
/// thread answering quick calls): its filter allows all a session's does, unless a real GPU is
/// configured, whose driver runs in the session threads with no filter of their own.
pub fn vhost_may_run_session_calls() -> bool {
    POLICY
        .get()
        .is_none_or(|p| p.mode == Mode::Off || p.confine_sessions)
}

/// Largest thread name the kernel keeps (`TASK_COMM_LEN`), with its NUL.
const THREAD_NAME_LEN: usize = 16;
/// Offset of `si_syscall` in a `SIGSYS` `siginfo_t` (after the three ints,
/// their padding and `si_call_addr`).
const SI_SYSCALL_OFFSET: usize = 24;

/// Writes `bytes` to stderr from a signal handler.
fn write_stderr(bytes: &[u8]) {
    // SAFETY: write(2) is async-signal-safe; the buffer is valid for its length.
    unsafe { libc::write(libc::STDERR_FILENO, bytes.as_ptr().cast(), bytes.len()) };
}

/// Formats `n` in decimal into `buf` without allocating; returns the digits.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

extern "C" fn on_sigsys(_signal: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for SIGSYS raised by
    // seccomp; `si_syscall` lies within it, at SI_SYSCALL_OFFSET.
    let field = unsafe { info.cast::<u8>().add(SI_SYSCALL_OFFSET) };
    // SAFETY: `field` points at the int `si_syscall` inside the siginfo_t.
    let nr = unsafe { field.cast::<i32>().read_unaligned() };
    let mut name = [0u8; THREAD_NAME_LEN];
    // SAFETY: PR_GET_NAME writes at most TASK_COMM_LEN bytes into `name`.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let mut digits = [0u8; 20];
    write_stderr(b"vgpud: seccomp: thread '");
    write_stderr(&name[..len]);
    write_stderr(b"' made system call ");
    write_stderr(decimal(u64::try_from(nr).unwrap_or(0), &mut digits));
    write_stderr(b", which its allowlist does not permit; aborting (see docs/security.md)\n");
    // SAFETY: abort(3) is async-signal-safe.
    unsafe { libc::abort() };
}

fn install_sigsys_handler() -> Result<(), Error> {
    // SAFETY: sigaction is plain data; every field used is set below.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigsys as *const () as usize;
    action.sa_flags = libc::SA_SIGINFO;
    // SAFETY: `action.sa_mask` is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: `action` is initialised and the handler only makes
    // async-signal-safe calls; the old action is not wanted.
    if unsafe { libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) } != 0 {
        return Err(Error::Handler(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    /// Runs `f` on a new thread under `kind`'s filter, with calls outside it
    /// failing with EPERM instead of aborting the test process.
    fn under<T: Send + 'static>(kind: ThreadKind, f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            let program = filter(kind, SeccompAction::Errno(libc::EPERM as u32)).unwrap();
            apply(kind, &program).unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    fn errno_of(ret: libc::c_long) -> Option<i32> {
        (ret < 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap())
    }

    #[test]
    fn every_kind_compiles() {
        for kind in ThreadKind::ALL {
            for mode in [Mode::Enforce, Mode::Log] {
                let program = filter(kind, mismatch_action(mode).unwrap()).unwrap();
                assert!(!program.is_empty(), "{kind:?}");
            }
        }
    }

    /// What [`vhost_may_run_session_calls`] relies on: a vhost thread may make every call a
    /// session thread may, with the same argument rules.
    #[test]
    fn the_vhost_list_covers_the_session_list() {
        let vhost = rules(ThreadKind::Vhost);
        for (nr, session_rules) in rules(ThreadKind::Session) {
            let v = vhost.get(&nr);
            assert!(
                v.is_some(),
                "call {nr} allowed to sessions, not to vhost threads"
            );
            assert_eq!(
                format!("{:?}", v.unwrap()),
                format!("{session_rules:?}"),
                "call {nr}: different argument rules"
            );
        }
    }

    #[test]
    fn a_session_thread_does_its_work() {
        let echoed = under(ThreadKind::Session, || {
            // Memory, threads, sockets it holds, time, read-only files.
            let mut big = vec![0u8; 64 << 20];
            big[12345] = 7;
            let (mut a, mut b) = UnixStream::pair().unwrap();
            a.set_nonblocking(false).unwrap();
            let t = std::thread::spawn(move || {
                let mut buf = [0u8; 5];
                b.read_exact(&mut buf).unwrap();
                b.write_all(&buf).unwrap();
            });
            a.write_all(b"hello").unwrap();
            let mut back = [0u8; 5];
            a.read_exact(&mut back).unwrap();
            t.join().unwrap();
            let _ = std::time::Instant::now();
            let parallelism = std::thread::available_parallelism().unwrap().get();
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            (back, big[12345], parallelism, status.contains("Seccomp"))
        });
        assert_eq!(echoed.0, *b"hello");
        assert_eq!(echoed.1, 7);
        assert!(echoed.2 >= 1);
        assert!(echoed.3);
    }

    #[test]
    fn a_session_thread_cannot_escape() {
        let denied = under(ThreadKind::Session, || {
            let path = c"/nonexistent/vgpu";
            let argv = [path.as_ptr(), std::ptr::null()];
            // SAFETY: valid NUL-terminated path and argv; fails under the filter.
            let exec = errno_of(unsafe {
                libc::syscall(libc::SYS_execve, path.as_ptr(), argv.as_ptr(), 0)
            });
            // SAFETY: plain call with constant arguments.
            let inet = errno_of(unsafe {
                libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0)
            });
            let file = c"/nonexistent/vgpu-seccomp-test";
            // SAFETY: valid path; the call is expected to fail.
            let rw = errno_of(unsafe {
                libc::syscall(
                    libc::SYS_openat,
                    libc::AT_FDCWD,
                    file.as_ptr(),
                    libc::O_RDWR | libc::O_CREAT,
                    0o600,
                )
            });
            // SAFETY: plain call; ptrace of self is refused by the filter first.
            let trace =
                errno_of(unsafe { libc::syscall(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0, 0, 0) });
            // SAFETY: an ioctl request outside the list on stderr.
            let tty = errno_of(unsafe {
                libc::syscall(libc::SYS_ioctl, 2, libc::TIOCSTI, std::ptr::null::<u8>())
            });
            // SAFETY: bind on an invalid descriptor; the filter refuses it before the kernel looks.
            let bind =
                errno_of(unsafe { libc::syscall(libc::SYS_bind, -1, std::ptr::null::<u8>(), 0) });
            [exec, inet, rw, trace, tty, bind]
        });
        assert_eq!(denied, [Some(libc::EPERM); 6]);
    }

    #[test]
    fn a_vhost_thread_may_accept_but_not_bind() {
        let (accept, bind) = under(ThreadKind::Vhost, || {
            // SAFETY: accept4 on an invalid descriptor: the kernel answers EBADF.
            let accept = errno_of(unsafe { libc::syscall(libc::SYS_accept4, -1, 0, 0, 0) });
            // SAFETY: as above for bind; the filter answers EPERM first.
            let bind =
                errno_of(unsafe { libc::syscall(libc::SYS_bind, -1, std::ptr::null::<u8>(), 0) });
            (accept, bind)
        });
        assert_eq!(accept, Some(libc::EBADF));
        assert_eq!(bind, Some(libc::EPERM));
    }

    #[test]
    fn the_control_filter_refuses_exec_and_ptrace_only() {
        let (exec, socket, trace) = under(ThreadKind::Control, || {
            let path = c"/nonexistent/vgpu";
            let argv = [path.as_ptr(), std::ptr::null()];
            // SAFETY: valid path and argv; refused by the filter.
            let exec = errno_of(unsafe {
                libc::syscall(libc::SYS_execve, path.as_ptr(), argv.as_ptr(), 0)
            });
            // SAFETY: plain call; a control thread may create sockets.
            let fd =
                unsafe { libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0) };
            if fd >= 0 {
                // SAFETY: `fd` was just opened by this thread.
                unsafe { libc::close(fd as i32) };
            }
            // SAFETY: plain call; refused by the filter.
            let trace =
                errno_of(unsafe { libc::syscall(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0, 0, 0) });
            (exec, fd >= 0, trace)
        });
        assert_eq!(exec, Some(libc::EPERM));
        assert!(socket);
        assert_eq!(trace, Some(libc::EPERM));
    }

    #[test]
    fn with_a_real_gpu_the_control_filter_denies_only_the_dangerous_calls() {
        let (exec, priority) = std::thread::spawn(|| {
            let program = denylist(&SeccompAction::Errno(libc::EPERM as u32)).unwrap();
            apply(ThreadKind::Control, &program).unwrap();
            let path = c"/nonexistent/vgpu";
            let argv = [path.as_ptr(), std::ptr::null()];
            // SAFETY: valid path and argv; refused by the filter.
            let exec = errno_of(unsafe {
                libc::syscall(libc::SYS_execve, path.as_ptr(), argv.as_ptr(), 0)
            });
            // SAFETY: plain query with a valid policy (what the CUDA driver asks).
            let priority =
                unsafe { libc::syscall(libc::SYS_sched_get_priority_max, libc::SCHED_FIFO) };
            (exec, priority)
        })
        .join()
        .unwrap();
        assert_eq!(exec, Some(libc::EPERM));
        assert!(priority > 0, "{priority}");
    }

    #[test]
    fn decimal_formats_numbers() {
        let mut buf = [0u8; 20];
        assert_eq!(decimal(0, &mut buf), b"0");
        assert_eq!(decimal(59, &mut buf), b"59");
        assert_eq!(decimal(u64::MAX, &mut buf), b"18446744073709551615");
    }
}
