#![no_main]
//! libFuzzer target: [`vgpu_fuzz::fatbin`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::fatbin(data));
