#![no_main]
//! libFuzzer target: [`vgpu_fuzz::config`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::config(data));
