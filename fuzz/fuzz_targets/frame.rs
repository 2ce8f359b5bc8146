#![no_main]
//! libFuzzer target: [`vgpu_fuzz::frame`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::frame(data));
