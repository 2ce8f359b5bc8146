#![no_main]
//! libFuzzer target: [`vgpu_fuzz::vgpu_chain`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::vgpu_chain(data));
