//! Puts libtorch's library folders on the `tessera` binary's rpath, so it runs without
//! LD_LIBRARY_PATH. Only with feature `train` (the only feature that links libtorch).
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if std::env::var_os("CARGO_FEATURE_TRAIN").is_none() {
        return;
    }
    for dir in libtorch_rpath_dirs() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
}

/// `$LIBTORCH/lib` and the CUDA runtime folder next to it in the wheel's site-packages.
fn libtorch_rpath_dirs() -> Vec<std::path::PathBuf> {
    let Some(root) = std::env::var_os("LIBTORCH") else {
        return Vec::new();
    };
    let root = std::path::PathBuf::from(root);
    let root = root.canonicalize().unwrap_or(root);
    let mut dirs = vec![root.join("lib")];
    if let Some(site) = root.parent() {
        dirs.push(site.join("nvidia").join("cu13").join("lib"));
    }
    dirs
}
