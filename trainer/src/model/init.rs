//! Random-weight checkpoints (filled in below).
