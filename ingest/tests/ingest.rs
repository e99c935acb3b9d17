//! tessera-ingest's integration tests, one module per file of this folder, built as one test
//! binary: one compile and link, and one queue for libtest's threads.
mod common;

mod bad_input;
mod determinism;
mod resume_inputs;
mod roundtrip;
