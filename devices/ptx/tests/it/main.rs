//! Integration tests of the PTX interpreter: one test binary, one module per topic (a new topic
//! is a new file here plus a `mod` line below).

mod basic;
mod budget;
mod cooperative;
mod corpus;
mod cubemap;
mod deviceio;
mod dynamic;
mod faults;
mod floatops;
mod fp8;
mod half;
mod heap;
mod indirect;
mod intops;
mod launch;
mod mbarrier;
mod memory;
mod mipmap;
mod mma;
mod mma_sync;
mod regalloc;
mod relocs;
mod texref;
mod texture;
mod video;
mod warp;
