//! Compiles the JPEG check (`csrc/jpeg_check.c`) against the system's libjpeg-turbo (Debian's
//! `libjpeg62-turbo-dev`, which `scripts/setup/setup.sh` installs as `libjpeg-dev`).
fn main() {
    println!("cargo:rerun-if-changed=csrc/jpeg_check.c");
    cc::Build::new()
        .file("csrc/jpeg_check.c")
        .opt_level(2)
        .warnings(true)
        .compile("tessera_jpeg_check");
    println!("cargo:rustc-link-lib=jpeg");
}
