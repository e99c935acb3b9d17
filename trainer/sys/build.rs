//! Build script of `tessera-sys`: compiles the C++ shims (csrc/, as one unit: c10d_shim.cpp, all_to_all.cpp (expert parallelism's
//! differentiable all-to-all), attention_shim.cpp for varlen
//! attention, profiler_shim.cpp, fused_adamw.cpp, stream_shim.cpp for side-stream uploads,
//! widened_linear.cpp for bf16 products on CPUs without bf16 arithmetic, recomputed.cpp for
//! selective activation recompute; their
//! error convention in shim_error.h) against libtorch's headers and
//! Debian's gloo headers, links it, and hands libtorch's lib folder and the CUDA runtime folder
//! (libcudart.so.13 / libcupti.so.13, which libtorch_cpu links) to the crates above it
//! (`DEP_TESSERA_SHIMS_RPATH`), whose `rpath.rs` puts them on their binaries' rpath so tests run
//! without LD_LIBRARY_PATH. Feature `cuda` adds ProcessGroupNCCL and links torch_cuda.
//!
//! With `cuda`, ProcessGroupNCCL.hpp needs headers the torch wheel does not ship, all in
//! `$CUDA_HOME/include`: the CUDA runtime's (PyPI wheel nvidia-cuda-runtime), crt/
//! (nvidia-cuda-crt), nv/ (nvidia-cuda-cccl), cublas, cusparse and cusolver's, and nccl.h
//! (nvidia-nccl-cu13), at the versions torch's cuda-toolkit pin names (torch 2.11: CUDA 13.0,
//! NCCL 2.28.9). Headers only: the libraries are the torch wheel's at link and run time.
use std::path::{Path, PathBuf};

/// Every C++ shim, once: compiled here and watched for changes.
const SHIMS: [&str; 8] = [
    "csrc/c10d_shim.cpp",
    "csrc/all_to_all.cpp",
    "csrc/attention_shim.cpp",
    "csrc/profiler_shim.cpp",
    "csrc/fused_adamw.cpp",
    "csrc/stream_shim.cpp",
    "csrc/widened_linear.cpp",
    "csrc/recomputed.cpp",
];

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=csrc/shim_error.h");
    println!("cargo:rerun-if-changed=csrc/c10d_group.h");
    for file in SHIMS {
        println!("cargo:rerun-if-changed={file}");
    }
    let lib_dir = match std::env::var_os("DEP_TCH_LIBTORCH_LIB") {
        Some(lib) => PathBuf::from(lib),
        None => panic!("DEP_TCH_LIBTORCH_LIB is not set: torch-sys did not find libtorch"),
    };
    let lib_dir = lib_dir.canonicalize().unwrap_or(lib_dir);
    let root = lib_dir.parent().unwrap_or(&lib_dir).to_path_buf();
    let mut rpath = vec![lib_dir.clone()];
    // The PyPI wheel keeps the CUDA runtime next to torch: site-packages/nvidia/cu13/lib.
    if let Some(site) = root.parent() {
        let cuda_rt = site.join("nvidia").join("cu13").join("lib");
        if cuda_rt.is_dir() {
            rpath.push(cuda_rt);
        }
    }
    // Crates that link this one read it as DEP_TESSERA_SHIMS_RPATH (see `rpath.rs`).
    match std::env::join_paths(&rpath) {
        Ok(joined) => println!("cargo:rpath={}", joined.to_string_lossy()),
        Err(e) => panic!("libtorch folders {rpath:?} cannot form a path list: {e}"),
    }
    compile_shim(&root, &lib_dir);
}

/// The shims as one translation unit that includes each file: each of them parses libtorch's
/// headers, which is nearly all of its compile time (as 8 units 66 s on one core of an AMD
/// EPYC, as one 16 s). The files stay apart in csrc/, but their anonymous namespaces are one
/// here: a helper name two files define fails to compile, so each file names its own apart.
fn unity_source() -> PathBuf {
    let out_dir = match std::env::var_os("OUT_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => panic!("OUT_DIR is not set: not run by cargo"),
    };
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut text = String::from("// Written by trainer/sys/build.rs: the shims as one unit.\n");
    for file in SHIMS {
        let file = crate_dir.join(file);
        text.push_str(&format!("#include \"{}\"\n", file.display()));
    }
    let path = out_dir.join("tessera_shims.cpp");
    if let Err(e) = std::fs::write(&path, text) {
        panic!("writing {}: {e}", path.display());
    }
    path
}

fn compile_shim(root: &Path, lib_dir: &Path) {
    let include = root.join("include");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file(unity_source())
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
        match std::env::var_os("CUDA_HOME") {
            Some(cuda_home) => {
                let include = Path::new(&cuda_home).join("include");
                if !include.join("nccl.h").is_file() {
                    println!(
                        "cargo:warning=feature cuda: {} has no nccl.h (see trainer/sys/build.rs)",
                        include.display()
                    );
                }
                build.include(include);
            }
            None => println!(
                "cargo:warning=feature cuda: CUDA_HOME is not set; the CUDA and NCCL headers \
                 must be on the compiler's default path (see trainer/sys/build.rs)"
            ),
        }
        println!("cargo:rerun-if-env-changed=CUDA_HOME");
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    build.compile("tessera_shims");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
}
