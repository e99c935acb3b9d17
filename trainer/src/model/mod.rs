//! LLaVA-architecture model in tch: SigLIP, projector, Qwen2, LoRA (model issue).
