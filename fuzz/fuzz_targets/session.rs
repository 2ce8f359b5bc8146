#![no_main]
//! libFuzzer target: [`vgpu_fuzz::session`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::session(data));
