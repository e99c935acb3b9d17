//! FSDP over c10d: flat sharded unit buffers, gather/free, recompute, reduce-scatter (FSDP issue).
