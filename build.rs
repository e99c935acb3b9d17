//! The root package's build script: libtorch's folders on the rpath of its binaries (the script
//! the trainer crates share, `trainer/sys/rpath.rs`), and the tests this machine cannot run.
//!
//! `TESSERA_TESTS_SKIP` (comma-separated names, default unset: every test runs) turns each name
//! into a cfg that marks the tests needing it `#[ignore]` with the reason, so cargo reports them
//! as ignored, never as passed. An unknown name stops the build, so a typo cannot leave a test
//! failing for a reason the machine has opted out of.
#[path = "trainer/sys/rpath.rs"]
mod rpath;

/// Each name `TESSERA_TESTS_SKIP` accepts, the cfg it sets, and what it is for.
const SKIPS: &[(&str, &str, &str)] = &[(
    "mount",
    "tessera_skip_mount",
    "tests/full_disk.rs mounts a tmpfs: root with CAP_SYS_ADMIN",
)];

fn main() {
    rpath::main();
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=trainer/sys/rpath.rs");
    println!("cargo::rerun-if-env-changed=TESSERA_TESTS_SKIP");
    for (_, cfg, _) in SKIPS {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    let skip = std::env::var("TESSERA_TESTS_SKIP").unwrap_or_default();
    for name in skip.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let Some((_, cfg, _)) = SKIPS.iter().find(|(known, _, _)| *known == name) else {
            let known: Vec<String> = SKIPS
                .iter()
                .map(|(n, _, why)| format!("`{n}` ({why})"))
                .collect();
            panic!(
                "TESSERA_TESTS_SKIP names `{name}`, which is not a test opt-out; known: {}",
                known.join(", ")
            );
        };
        println!("cargo::rustc-cfg={cfg}");
    }
}
