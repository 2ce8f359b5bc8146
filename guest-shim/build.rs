//! Gives the cdylib the soname of NVIDIA's driver library, so programs and
//! the dynamic loader treat it as `libcuda.so.1`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
