#![no_main]
//! libFuzzer target: [`vgpu_fuzz::session_ring`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::session_ring(data));
