//! The end-to-end tests of the `tessera` binary and the workspace's crates together, one module
//! per file of this folder, built as one test binary: one compile and one link instead of one
//! per file, and libtest's threads then run every test from one queue, so a long test of one
//! file overlaps the short ones of another instead of leaving a core idle at the end of its
//! file. Run one file's tests with its module name: `cargo test --release --features
//! test-hooks --test e2e multinode::`.
mod support;

mod anyres;
mod bench_cli;
mod checkpoint_async;
mod demo_parts;
mod expert_parallel;
mod families;
mod feature_stats;
mod full_disk;
mod generate;
mod ingest;
mod layouts;
mod multi_image;
mod multinode;
mod over_long;
mod readme;
mod recompute_auto;
mod s3_faults;
mod s3_shards;
mod synth;
mod train;
mod train_elastic;
mod train_learns;
mod trust;
