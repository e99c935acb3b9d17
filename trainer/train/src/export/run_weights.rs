//! A run's model one tensor at a time, for `export --format llava-hf` and `generate --run`.
//! Each parameter is
//! 1. the checkpoint's trained value, when it trained (read from format 4's shards, converted
//!    piece by piece into the dtype asked for);
//! 2. for the projector of a run that did not train one (`--train lm`), the projector the run
//!    started from ([`initial_projector`]);
//! 3. otherwise the tensor of the vision or LM directory the run read.
//!
//! Nothing is read before it is asked for, and what is read is the one tensor asked for: a
//! caller that writes or converts each tensor before asking for the next never holds the model
//! twice.
use crate::checkpoint::trained::TrainedTensors;
use crate::config::TrainConfig;
use crate::export::error::ExportError;
use crate::export::run_checkpoint::newest_complete;
use std::path::Path;
use tch::{Kind, Tensor};
use tessera_fsdp::ParamMap;
use tessera_model::{
    fold_into_projector, FeatureStats, HfCheckpoint, ModelError, Vlm, FOLDED_KEYS,
};

/// Key prefix a `SiglipModel` checkpoint carries and a transformers 5 `SiglipVisionModel`
/// checkpoint omits.
const VISION_PREFIX: &str = "vision_model.";
const PROJECTOR_PREFIX: &str = "mm_projector.";

/// Where a run's parameters come from (see the module docs).
pub(crate) struct RunWeights<'a> {
    vision: HfCheckpoint,
    lm: HfCheckpoint,
    trained: &'a TrainedTensors,
    initial_projector: Option<&'a ParamMap>,
    /// A `--standardize-features` run's statistics, folded into the projector's first layer
    /// as it is read (the model asking is LLaVA's plain projector).
    feature_stats: Option<&'a FeatureStats>,
}

impl<'a> RunWeights<'a> {
    /// Opens the source directories (headers only).
    pub(crate) fn open(
        vision_dir: &Path,
        lm_dir: &Path,
        trained: &'a TrainedTensors,
        (initial_projector, feature_stats): (Option<&'a ParamMap>, Option<&'a FeatureStats>),
    ) -> Result<Self, ExportError> {
        Ok(RunWeights {
            vision: HfCheckpoint::open(vision_dir)?,
            lm: HfCheckpoint::open(lm_dir)?,
            trained,
            initial_projector,
            feature_stats,
        })
    }

    /// The source checkpoint holding `name` and its key there.
    fn source<'k>(&self, name: &'k str) -> (&HfCheckpoint, &'k str) {
        match name.strip_prefix(VISION_PREFIX) {
            Some(short) if !self.vision.contains(name) && self.vision.contains(short) => {
                (&self.vision, short)
            }
            Some(_) => (&self.vision, name),
            None => (&self.lm, name),
        }
    }

    /// Parameter `name` of shape `shape`, in `kind` (or, with `None`, as trained (f32) or as
    /// stored), on the CPU.
    pub(crate) fn tensor(
        &self,
        name: &str,
        shape: &[i64],
        kind: Option<Kind>,
    ) -> Result<Tensor, ExportError> {
        if let Some(stats) = self.feature_stats.filter(|_| FOLDED_KEYS.contains(&name)) {
            return self.folded(name, shape, stats, kind);
        }
        self.as_trained(name, shape, kind)
    }

    /// `name` (of `shape`), one of the projector's first layer's, with `stats` folded in.
    fn folded(
        &self,
        name: &str,
        shape: &[i64],
        stats: &FeatureStats,
        kind: Option<Kind>,
    ) -> Result<Tensor, ExportError> {
        let [weight, bias] = FOLDED_KEYS;
        let lm_hidden = shape.first().copied().unwrap_or_default();
        let hidden = stats.std.len() as i64;
        let w = self.as_trained(weight, &[lm_hidden, hidden], Some(Kind::Float))?;
        let b = self.as_trained(bias, &[lm_hidden], Some(Kind::Float))?;
        let mut layer = ParamMap::from([(weight.to_string(), w), (bias.to_string(), b)]);
        fold_into_projector(&mut layer, stats)?;
        let t = layer.remove(name).ok_or_else(|| {
            ExportError::Model(ModelError::InvalidConfig(format!("no `{name}` to fold")))
        })?;
        Ok(match kind {
            Some(kind) => t.to_kind(kind),
            None => t,
        })
    }

    /// [`Self::tensor`] as the run holds it (no folding).
    fn as_trained(
        &self,
        name: &str,
        shape: &[i64],
        kind: Option<Kind>,
    ) -> Result<Tensor, ExportError> {
        let convert = |t: Tensor| match kind {
            Some(kind) => t.to_kind(kind),
            None => t,
        };
        let t = if let Some(t) = self.trained.get_as(name, kind.unwrap_or(Kind::Float))? {
            t
        } else if name.starts_with(PROJECTOR_PREFIX) {
            let t = self
                .initial_projector
                .and_then(|p| p.get(name))
                .ok_or_else(|| {
                    ExportError::Model(ModelError::InvalidConfig(format!(
                        "the trained tensors hold no `{name}`"
                    )))
                })?;
            convert(t.shallow_clone())
        } else {
            let (ckpt, key) = self.source(name);
            convert(ckpt.tensor_as_stored(key, shape)?)
        };
        if t.size() != shape {
            return Err(ExportError::Model(ModelError::InvalidConfig(format!(
                "`{name}` has shape {:?}, the model needs {shape:?}",
                t.size()
            ))));
        }
        Ok(t)
    }

    /// The widest dtype the source directories store `names` in: `Float` if any is F32 or F16,
    /// else `BFloat16` (every Hub Qwen2.5 and SigLIP checkpoint). Trained and projector
    /// tensors do not count: they are f32 masters whatever the sources ship.
    pub(crate) fn source_kind<'n>(&self, names: impl IntoIterator<Item = &'n str>) -> Kind {
        let mut widest = Kind::BFloat16;
        for name in names {
            let (ckpt, key) = self.source(name);
            match ckpt.stored_kind(key) {
                Some(Kind::BFloat16) | None => {}
                Some(_) => widest = Kind::Float,
            }
        }
        widest
    }
}

/// For a process about to read a model tensor by tensor (`tessera export`, `tessera
/// generate`): glibc serves every block of 1 MiB or more with its own mapping and unmaps it on
/// free. By default it raises that threshold to the largest block freed so far (up to 32 MiB),
/// after which the tensors kept and the transients that read or convert them share the heap,
/// whose holes it cannot hand back: loading the Hub-shaped full fine-tune for generation
/// peaked about 230 MB above its weights that way, 30 MB with the fixed threshold
/// (docs/performance-notes.md, "Memory"). The opposite of the trainer's one-rank setting (`setup.rs`),
/// which keeps freed memory for the next step's tensors.
pub fn unmap_freed_tensors() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's thresholds, under glibc's own arena lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// The projector a run that did not train one (`--train lm`, `--train lm,vision`) started from,
/// which its checkpoints do not hold: `--init-projector`'s file, or the newest complete
/// checkpoint of `--init-projector`'s run (as training read it, if it has not moved on since),
/// or else the fresh projector the run's seed drew. `None` when the run trained its projector.
pub(crate) fn initial_projector(
    run: &Path,
    cfg: &TrainConfig,
    vlm: &Vlm,
) -> Result<Option<(ParamMap, String)>, ExportError> {
    if cfg.train.projector {
        return Ok(None);
    }
    let Some(path) = &cfg.init_projector else {
        let projector = vlm.initial_projector(None, cfg.seed)?;
        return Ok(Some((
            projector,
            format!("the fresh one seed {} draws", cfg.seed),
        )));
    };
    let shown = path.display();
    if path.is_file() {
        let projector = vlm.initial_projector(Some(path), cfg.seed)?;
        return Ok(Some((projector, format!("--init-projector {shown}"))));
    }
    if path.is_dir() {
        let ckpt = newest_complete(path)?;
        let projector =
            TrainedTensors::open(&ckpt)?.collect(|k| k.starts_with(PROJECTOR_PREFIX))?;
        if projector.len() != 4 {
            return Err(ExportError::BadRun {
                run: run.to_path_buf(),
                what: format!(
                    "it did not train the projector and started from --init-projector {shown}, \
                     whose checkpoint {} holds {} projector tensors, not 4",
                    ckpt.dir.display(),
                    projector.len()
                ),
            });
        }
        tracing::warn!(
            "run {}: the projector did not train; taking the one it started from, in \
             --init-projector {shown}'s newest complete checkpoint {}",
            run.display(),
            ckpt.dir.display()
        );
        let from = format!("--init-projector {shown} ({})", ckpt.dir.display());
        return Ok(Some((projector, from)));
    }
    Err(ExportError::BadRun {
        run: run.to_path_buf(),
        what: format!(
            "it did not train the projector (--train {}), so its checkpoints hold none; it \
             started from --init-projector {shown}, which is not there from here (a relative \
             path is read from the folder `tessera train` ran in: run this from that folder)",
            cfg.train
        ),
    })
}
