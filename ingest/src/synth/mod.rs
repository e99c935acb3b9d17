//! `tessera synth`: LLaVA-Pretrain-shaped synthetic datasets (foundation issue).
