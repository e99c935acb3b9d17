//! Build script: compiles the c10d shim (csrc/c10d_shim.cpp) against libtorch's headers and
//! Debian's gloo headers, links it, and puts libtorch's lib folder and the CUDA runtime folder
//! (libcudart.so.13 / libcupti.so.13, which libtorch_cpu links) on the rpath so binaries and
//! tests run without LD_LIBRARY_PATH. Feature `cuda` adds ProcessGroupNCCL and links torch_cuda.
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=csrc/c10d_shim.cpp");
    let lib_dir = match std::env::var_os("DEP_TCH_LIBTORCH_LIB") {
        Some(lib) => PathBuf::from(lib),
        None => panic!("DEP_TCH_LIBTORCH_LIB is not set: torch-sys did not find libtorch"),
    };
    let lib_dir = lib_dir.canonicalize().unwrap_or(lib_dir);
    let root = lib_dir.parent().unwrap_or(&lib_dir).to_path_buf();
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    // The PyPI wheel keeps the CUDA runtime next to torch: site-packages/nvidia/cu13/lib.
    if let Some(site) = root.parent() {
        let cuda_rt = site.join("nvidia").join("cu13").join("lib");
        if cuda_rt.is_dir() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", cuda_rt.display());
        }
    }
    compile_shim(&root, &lib_dir);
}

fn compile_shim(root: &Path, lib_dir: &Path) {
    let include = root.join("include");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("csrc/c10d_shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DUSE_C10D_GLOO")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false);
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        build.flag("-DUSE_C10D_NCCL").flag("-DTESSERA_CUDA");
        if let Some(cuda_home) = std::env::var_os("CUDA_HOME") {
            build.include(Path::new(&cuda_home).join("include"));
        }
        println!("cargo:rerun-if-env-changed=CUDA_HOME");
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    build.compile("tessera_c10d");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
}
