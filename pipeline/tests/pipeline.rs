//! tessera-pipeline's integration tests, one module per file of this folder, built as one test
//! binary: one compile and link, and one queue for libtest's threads.

mod anyres_views;
mod loader;
mod loader_images;
mod mix;
mod plan;
