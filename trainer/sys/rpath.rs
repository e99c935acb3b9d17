//! Build script shared by the crates that link `tessera-sys` (`build = "../sys/rpath.rs"`; the
//! root package's `build.rs` calls it as a module):
//! puts libtorch's library folders, which `tessera-sys`'s build script found, on the rpath of
//! the crate's test and bench binaries, so they run without LD_LIBRARY_PATH. (A dependency's
//! `rustc-link-arg` reaches only its own binaries, so each linking crate says it again.)
pub(crate) fn main() {
    if let Some(dirs) = std::env::var_os("DEP_TESSERA_SHIMS_RPATH") {
        for dir in std::env::split_paths(&dirs) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }
}
