#![no_main]
//! libFuzzer target: [`vgpu_fuzz::ptx`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::ptx(data));
