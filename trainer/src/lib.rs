//! tch model (SigLIP, projector, Qwen2, LoRA), c10d collectives, FSDP and the train loop.
//! `unit` is the contract between the model and FSDP.
pub mod dist;
pub mod fsdp;
pub mod model;
pub mod train;
pub mod unit;
