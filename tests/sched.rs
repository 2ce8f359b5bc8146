//! Scheduler-share tests: each measures the shares of a CPU-bound simulated GPU, so they run one
//! at a time (`sched_common::serial`) in a binary of their own, away from the other tests.

mod sched_common;
mod sched_preempt;
mod sched_shares;
