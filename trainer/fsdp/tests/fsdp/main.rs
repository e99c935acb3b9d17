//! `tessera-fsdp`'s c10d tests, one binary (libtorch links once): collectives between threads
//! and the `--nproc` launcher with real processes. FSDP over a toy chain of units is its own
//! binary (`toy_chain.rs`), away from the timed-out collective this one leaves behind.
mod collectives;
mod launcher;
