//! The model's tests, one binary (libtorch links once): parity with transformers, LoRA in
//! PEFT's format, the chunked loss, bf16 products through f32 kernels, packed rows, and loading
//! Hugging Face directories.
#[path = "../support/mod.rs"]
mod support;

mod anyres;
mod dinov2;
mod families;
mod gemm;
mod golden;
mod lora;
mod loss;
mod moe;
mod packing;
mod weights;
