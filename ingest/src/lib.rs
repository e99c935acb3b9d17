//! LLaVA json + images (folder or zip) -> tessera shards (ingest issue); and `synth`, a
//! generator of datasets in LLaVA-Pretrain's exact layout.
pub mod synth;
