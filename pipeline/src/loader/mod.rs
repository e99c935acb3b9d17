//! The loader: shard reads, decode + resize on worker threads, packing into MicroBatch (pipeline issue).
