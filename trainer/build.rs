//! Placeholder: rpath for libtorch (the c10d shim is added by the FSDP issue).
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Some(lib) = std::env::var_os("DEP_TCH_LIBTORCH_LIB") {
        println!(
            "cargo:rustc-link-arg=-Wl,-rpath,{}",
            std::path::Path::new(&lib).display()
        );
    }
}
