//! Per-VM budgets as the config sets them: the limits of `[limits]` and
//! `[vm.limits]` (docs/admin.md), their defaults and the largest values a
//! config may set. The broker counts use against them (`vgpu_broker::limits`).

/// Default sessions (guest processes) a VM may have at once.
pub const DEFAULT_SESSIONS: u32 = 1024;
/// Default connections a VM may hold at once, greeted or not.
pub const DEFAULT_CONNECTIONS: u32 = 1024;
/// Default modules a VM's sessions may have loaded at once.
pub const DEFAULT_MODULES: u32 = 4096;
/// Default bytes of module images a VM's sessions may have loaded at once.
pub const DEFAULT_MODULE_BYTES: u64 = 1 << 30;
/// Default streams a VM's sessions may hold at once.
pub const DEFAULT_STREAMS: u32 = 16384;
/// Default events a VM's sessions may hold at once.
pub const DEFAULT_EVENTS: u32 = 65536;
/// Default other handles (contexts, functions, memory pools, allocation
/// handles, executable graphs) a VM's sessions may hold at once.
pub const DEFAULT_HANDLES: u32 = 65536;
/// Default bytes of queued asynchronous work (copy data, launch parameters)
/// a VM's sessions may hold at once.
pub const DEFAULT_QUEUED_BYTES: u64 = 256 << 20;
/// Default bytes of executable graphs a VM's sessions may hold at once.
pub const DEFAULT_GRAPH_BYTES: u64 = 256 << 20;
/// Default host memory a VM's running launches may hold in interpreter state
/// on the simulated GPU (register files, call frames, local and shared memory
/// of the blocks running at once).
pub const DEFAULT_INTERPRETER_BYTES: u64 = 1 << 30;
/// Largest `sessions` or `connections` a config may set: each costs vgpud a thread.
pub const MAX_SESSIONS: u32 = 4096;
/// Largest `modules` a config may set.
pub const MAX_MODULES: u32 = 1 << 20;
/// Largest `module_bytes` a config may set.
pub const MAX_MODULE_BYTES: u64 = 64 << 30;
/// Largest `streams`, `events` or `handles` a config may set (each costs vgpud
/// a few hundred bytes at most).
pub const MAX_HANDLES: u32 = 1 << 22;
/// Smallest `queued_bytes` a config may set: one frame's data (8 MiB) and its
/// fields always fit, so a single copy never exceeds the budget.
pub const MIN_QUEUED_BYTES: u64 = 16 << 20;
/// Largest `queued_bytes` a config may set.
pub const MAX_QUEUED_BYTES: u64 = 16 << 30;
/// Largest `graph_bytes` a config may set.
pub const MAX_GRAPH_BYTES: u64 = 64 << 30;
/// Smallest `interpreter_bytes` a config may set: one block with the largest
/// register file the interpreter accepts (64 MiB) always fits.
pub const MIN_INTERPRETER_BYTES: u64 = 64 << 20;
/// Largest `interpreter_bytes` a config may set.
pub const MAX_INTERPRETER_BYTES: u64 = 64 << 30;

/// A VM's budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmLimits {
    /// Sessions at once (`sessions`).
    pub sessions: u32,
    /// Connections at once, greeted or not (`connections`).
    pub connections: u32,
    /// Modules loaded at once across the VM's sessions (`modules`).
    pub modules: u32,
    /// Bytes of module images loaded at once across the VM's sessions (`module_bytes`).
    pub module_bytes: u64,
    /// Streams held at once across the VM's sessions (`streams`).
    pub streams: u32,
    /// Events held at once across the VM's sessions (`events`).
    pub events: u32,
    /// Other handles held at once across the VM's sessions (`handles`):
    /// contexts, functions, memory pools, allocation handles, executable graphs,
    /// interprocess memory handles exported or opened, texture and surface objects.
    pub handles: u32,
    /// Bytes of queued asynchronous work across the VM's sessions (`queued_bytes`).
    pub queued_bytes: u64,
    /// Bytes of executable graphs across the VM's sessions (`graph_bytes`).
    pub graph_bytes: u64,
    /// Host memory of interpreter state across the VM's running launches
    /// (`interpreter_bytes`).
    pub interpreter_bytes: u64,
}

impl Default for VmLimits {
    fn default() -> Self {
        VmLimits {
            sessions: DEFAULT_SESSIONS,
            connections: DEFAULT_CONNECTIONS,
            modules: DEFAULT_MODULES,
            module_bytes: DEFAULT_MODULE_BYTES,
            streams: DEFAULT_STREAMS,
            events: DEFAULT_EVENTS,
            handles: DEFAULT_HANDLES,
            queued_bytes: DEFAULT_QUEUED_BYTES,
            graph_bytes: DEFAULT_GRAPH_BYTES,
            interpreter_bytes: DEFAULT_INTERPRETER_BYTES,
        }
    }
}

impl VmLimits {
    /// The limit of `budget`.
    pub fn get(&self, budget: Budget) -> u64 {
        match budget {
            Budget::Sessions => u64::from(self.sessions),
            Budget::Connections => u64::from(self.connections),
            Budget::Modules => u64::from(self.modules),
            Budget::ModuleBytes => self.module_bytes,
            Budget::Streams => u64::from(self.streams),
            Budget::Events => u64::from(self.events),
            Budget::Handles => u64::from(self.handles),
            Budget::QueuedBytes => self.queued_bytes,
            Budget::GraphBytes => self.graph_bytes,
            Budget::InterpreterBytes => self.interpreter_bytes,
        }
    }
}

/// One of a VM's budgets besides memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// `limits.sessions`.
    Sessions,
    /// `limits.connections`.
    Connections,
    /// `limits.modules`.
    Modules,
    /// `limits.module_bytes`.
    ModuleBytes,
    /// `limits.streams`.
    Streams,
    /// `limits.events`.
    Events,
    /// `limits.handles`.
    Handles,
    /// `limits.queued_bytes`.
    QueuedBytes,
    /// `limits.graph_bytes`.
    GraphBytes,
    /// `limits.interpreter_bytes`.
    InterpreterBytes,
}

impl Budget {
    /// Every budget, in the order the API and metrics list them.
    pub const ALL: [Budget; 10] = [
        Budget::Sessions,
        Budget::Connections,
        Budget::Modules,
        Budget::ModuleBytes,
        Budget::Streams,
        Budget::Events,
        Budget::Handles,
        Budget::QueuedBytes,
        Budget::GraphBytes,
        Budget::InterpreterBytes,
    ];

    /// The budget's config key (under `[limits]`).
    pub fn key(self) -> &'static str {
        match self {
            Budget::Sessions => "sessions",
            Budget::Connections => "connections",
            Budget::Modules => "modules",
            Budget::ModuleBytes => "module_bytes",
            Budget::Streams => "streams",
            Budget::Events => "events",
            Budget::Handles => "handles",
            Budget::QueuedBytes => "queued_bytes",
            Budget::GraphBytes => "graph_bytes",
            Budget::InterpreterBytes => "interpreter_bytes",
        }
    }

    /// What the budget counts, for messages ("3 streams").
    pub fn what(self) -> &'static str {
        match self {
            Budget::Sessions => "sessions",
            Budget::Connections => "connections",
            Budget::Modules => "modules",
            Budget::Streams => "streams",
            Budget::Events => "events",
            Budget::Handles => "handles (contexts, functions, pools, graphs)",
            Budget::ModuleBytes
            | Budget::QueuedBytes
            | Budget::GraphBytes
            | Budget::InterpreterBytes => "bytes",
        }
    }
}
