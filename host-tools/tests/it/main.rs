//! Integration tests of the host tools: one test binary, one module per topic (a new topic is a
//! new file here plus a `mod` line below).

mod passthrough_bind;
mod passthrough_cli;
mod passthrough_list;
mod passthrough_sriov;
mod passthrough_verify;
