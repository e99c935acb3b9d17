//! tch model (SigLIP, projector, Qwen2, LoRA), c10d collectives, FSDP and the train loop.
//! `unit` is the contract between the model and FSDP.
pub mod unit;
