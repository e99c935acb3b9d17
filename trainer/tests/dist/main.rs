//! c10d's tests, one binary (libtorch links once): collectives between threads and the
//! `--nproc` launcher with real processes.
mod collectives;
mod launcher;
