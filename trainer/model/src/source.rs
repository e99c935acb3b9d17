//! The VLM's initial parameters as FSDP reads them at start-up: straight from the Hugging
//! Face checkpoints, one slice at a time ([`tessera_fsdp::ParamSource`]). A rank reads only the
//! slices its shards keep, in the stored dtype (a bf16 Hub checkpoint is converted chunk by
//! chunk into the shard), so no rank ever holds the full model: its peak host memory is its
//! shards plus one 64 MiB read buffer. Only the parameters no checkpoint provides (projector,
//! LoRA adapters: a few percent of the model) are built whole, in f32.
use super::error::{ModelError, Result};
use super::vision;
use super::vlm::Vlm;
use super::weights::HfCheckpoint;
use std::collections::HashMap;
use std::path::Path;
use tch::Tensor;
use tessera_fsdp::{ParamMap, ParamSource, SourceError};

/// Key prefix a `SiglipModel` checkpoint carries and a transformers 5 `SiglipVisionModel`
/// checkpoint omits.
const VISION_PREFIX: &str = "vision_model.";

/// Both checkpoints opened (headers only) plus the freshly initialised parameters.
pub struct VlmInit {
    vision: HfCheckpoint,
    lm: HfCheckpoint,
    /// Model key -> (is a vision key, key as stored in its checkpoint).
    stored: HashMap<String, (bool, String)>,
    fresh: ParamMap,
}

impl VlmInit {
    /// Bytes read from both checkpoints so far (each rank reads about 1/W of them).
    pub fn bytes_read(&self) -> u64 {
        self.vision.bytes_read() + self.lm.bytes_read()
    }
}

impl Vlm {
    /// Opens the checkpoints and checks, from their headers alone, that every parameter the
    /// model reads is there with its exact shape (so a broken checkpoint fails on every rank
    /// before any collective). Nothing is read yet: FSDP asks for its slices.
    pub fn init_source(
        &self,
        vision_dir: &Path,
        lm_dir: &Path,
        projector_file: Option<&Path>,
        seed: u64,
    ) -> Result<VlmInit> {
        let vision = HfCheckpoint::open(vision_dir)?;
        let lm = HfCheckpoint::open(lm_dir)?;
        let mut stored = HashMap::new();
        let vision_specs = vision::param_specs(&self.vision);
        for (is_vision, specs, ckpt, dir) in [
            (true, vision_specs, &vision, vision_dir),
            (false, self.lm_checkpoint_params(), &lm, lm_dir),
        ] {
            for spec in specs {
                let short = spec.name.strip_prefix(VISION_PREFIX);
                let key = match short {
                    Some(short)
                        if is_vision && !ckpt.contains(&spec.name) && ckpt.contains(short) =>
                    {
                        short.to_string()
                    }
                    _ => spec.name.clone(),
                };
                let found = ckpt.shape(&key).ok_or_else(|| ModelError::MissingTensor {
                    dir: dir.into(),
                    name: key.clone(),
                })?;
                if found != spec.shape {
                    return Err(ModelError::ShapeMismatch {
                        path: dir.into(),
                        name: key,
                        expected: spec.shape.clone(),
                        found: found.to_vec(),
                    });
                }
                stored.insert(spec.name, (is_vision, key));
            }
        }
        let fresh = self.fresh_params(projector_file, seed, &lm)?;
        Ok(VlmInit {
            vision,
            lm,
            stored,
            fresh,
        })
    }
}

impl ParamSource for VlmInit {
    fn read_into(
        &self,
        name: &str,
        shape: &[i64],
        start: i64,
        dst: &Tensor,
    ) -> std::result::Result<(), SourceError> {
        if self.fresh.contains_key(name) {
            return self.fresh.read_into(name, shape, start, dst);
        }
        let (is_vision, key) = self.stored.get(name).ok_or(SourceError::Missing)?;
        let ckpt = if *is_vision { &self.vision } else { &self.lm };
        ckpt.read_range_into(key, shape, start, dst)
            .map_err(|e| SourceError::Source(Box::new(e)))
    }
}
