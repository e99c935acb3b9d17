//! Collectives from PyTorch c10d through a C++ shim; rendezvous; rank launcher (FSDP issue).
