//! Everything a rank builds before its first step: the process group, the dataset and its
//! metadata, the model and its parameters on the device, the fingerprints a checkpoint is
//! checked against, and the per-parameter peak learning rates.
use crate::checkpoint::format::ModelFingerprint;
use crate::checkpoint::save::WriterRanks;
use crate::checkpoint::trained::TrainedTensors;
use crate::config::{ConfigError, Device, TrainConfig};
use crate::data::TrainData;
use crate::error::{io, TrainError};
use crate::run_dir::RunDir;
use crate::shard_tokenizer;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tessera_fsdp::dist::{self, Backend, ExpertMesh, Mesh, ProcessGroup, RankEnv};
use tessera_model::{
    save_safetensors, ExpertGroup, LmConfig, LoraConfig, Vlm, VlmInit, VlmOptions,
};

/// A rank, ready to train.
pub(crate) struct Setup {
    pub pg: Arc<ProcessGroup>,
    /// HYBRID_SHARD's node and replica groups.
    pub mesh: Option<Mesh>,
    /// `--expert-parallel`: the ranks holding the same experts and their job ranks (the
    /// expert group itself lives in the model's sparse layers).
    pub expert_replicas: Option<(ProcessGroup, Vec<usize>)>,
    pub rank: usize,
    pub world_size: usize,
    pub data: TrainData,
    /// The object stores behind URL shard sets (their request counts: the run logs retries).
    pub stores: Vec<Arc<tessera_remote::ObjectFiles>>,
    pub samples: Vec<tessera_shards::SampleMeta>,
    /// Under `--image-layout anyres_max_N`: each sample's image tokens and tiles, from the
    /// stored image sizes (the planner's lengths); `None` under `single`.
    pub images: Option<Vec<tessera_shards::SampleImages>>,
    pub vlm: Arc<Vlm>,
    pub model_fingerprint: ModelFingerprint,
    pub device: tch::Device,
}

impl Setup {
    /// This rank and its group, as a checkpoint write needs them.
    pub(crate) fn writer_ranks(&self) -> WriterRanks<'_> {
        WriterRanks {
            pg: &self.pg,
            rank: self.rank,
            world_size: self.world_size,
        }
    }
}

/// Splits this machine's cores between its local ranks for torch's intra-op threads (unless
/// OMP_NUM_THREADS says otherwise): two ranks with all cores each would fight over them.
fn share_cores(env: Option<&RankEnv>) {
    if std::env::var_os("OMP_NUM_THREADS").is_some() {
        return;
    }
    let local_ranks = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .or(env.map(|e| e.world_size))
        .unwrap_or(1)
        .max(1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tch::set_num_threads((cores / local_ranks).max(1) as i32);
}

/// On CPU, keeps freed memory in the process for the next tensor instead of handing it back
/// to the kernel. glibc serves blocks above 32 MiB with fresh mmaps and unmaps them on free,
/// so every tensor of that size (the tied embedding, gathered afresh at each use; the loss's
/// logit chunks) costs a page fault per 4 KiB: a third of a tiny-preset step went to the
/// kernel zeroing pages. Same results; peak RSS grows by what the step frees and reallocates.
/// With several ranks, gloo's threads also allocate the gathered buffers, each thread from an
/// arena of its own that cannot hold a block that size, so `one_arena` puts every thread on
/// the main heap (set before the process group starts those threads).
fn keep_freed_memory(one_arena: bool) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's thresholds, under glibc's own arena lock.
    unsafe {
        if one_arena {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TOP_PAD, 256 << 20);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = one_arena;
}

/// Runs whose vision and LM weights take less than this on disk keep freed memory at any
/// world size: what the heap then holds beyond glibc's defaults is a few hundred MB, and the
/// page faults it saves were a quarter of a two- or four-rank tiny-preset run
/// (scripts/bench/allocator_bench.sh). Larger runs keep it at one rank only: at W=2 a
/// Hub-shaped rank's peak grew from 2.9 to 3.8 GB for no step time (docs/performance-notes.md,
/// "Memory").
const SMALL_RUN_WEIGHT_BYTES: u64 = 1 << 30;

/// Bytes of the `.safetensors` files directly in `dir` (0 for what cannot be listed: the
/// model's own loading names that error).
fn weight_bytes(dir: &Path) -> u64 {
    safetensors_files(dir).map_or(0, |files| {
        files
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum()
    })
}

/// Joins the job (torchrun variables) or forms a one-rank group.
pub(crate) fn process_group(
    cfg: &TrainConfig,
    env: Option<&RankEnv>,
) -> Result<ProcessGroup, TrainError> {
    share_cores(env);
    if cfg.device == Device::Cpu {
        let one_rank = env.is_none_or(|e| e.world_size == 1);
        if one_rank || weight_bytes(&cfg.vision) + weight_bytes(&cfg.lm) < SMALL_RUN_WEIGHT_BYTES {
            keep_freed_memory(!one_rank);
        }
    }
    let timeout = Duration::from_secs(cfg.collective_timeout_s);
    let backend = match cfg.device {
        Device::Cpu => Backend::Gloo,
        Device::Cuda => Backend::Nccl,
    };
    if backend == Backend::Nccl && tch::Cuda::device_count() == 0 {
        return Err(ConfigError::Invalid {
            field: "device",
            reason: "cuda was asked for but torch sees no CUDA device".into(),
        }
        .into());
    }
    Ok(match env {
        Some(env) => dist::init_process_group(env, backend, timeout)?,
        None => ProcessGroup::single_on(backend, timeout)?,
    })
}

/// `--expert-parallel`'s groups (none at 1). N must divide the world size; a run started
/// without ranks (no torchrun, no --nproc) has one rank, which N > 1 cannot divide.
pub(crate) fn expert_mesh(
    cfg: &TrainConfig,
    env: Option<&RankEnv>,
    pg: &ProcessGroup,
) -> Result<Option<ExpertMesh>, TrainError> {
    let n = cfg.expert_parallel;
    if n <= 1 {
        return Ok(None);
    }
    let world = pg.world_size();
    let env = match env {
        Some(env) if world.is_multiple_of(n) => env,
        _ => {
            return Err(ConfigError::Invalid {
                field: "expert_parallel",
                reason: format!(
                    "{n} does not divide the {world} ranks of this run (expert groups are {n} \
                     consecutive ranks: start {n}, {}, ... ranks with --nproc or torchrun)",
                    2 * n
                ),
            }
            .into())
        }
    };
    let timeout = Duration::from_secs(cfg.collective_timeout_s);
    Ok(Some(dist::expert_mesh(env, n, pg.backend(), timeout)?))
}

/// HYBRID_SHARD's groups, after checking on every rank that every machine runs as many ranks.
pub(crate) fn hybrid_mesh(
    cfg: &TrainConfig,
    env: &RankEnv,
    pg: &ProcessGroup,
) -> Result<Mesh, TrainError> {
    let mine = tch::Tensor::from_slice(&[env.local_world_size as i64]);
    let mut all = tch::Tensor::zeros(
        [env.world_size as i64],
        (tch::Kind::Int64, tch::Device::Cpu),
    );
    pg.all_gather_into(&mut all, &mine, "LOCAL_WORLD_SIZE check")?
        .wait()?;
    let counts: Vec<usize> = Vec::<i64>::try_from(&all)?
        .into_iter()
        .map(|c| c as usize)
        .collect();
    let backend = pg.backend();
    let timeout = Duration::from_secs(cfg.collective_timeout_s);
    Ok(dist::hybrid_mesh(env, &counts, backend, timeout)?)
}

/// Every rank must see rank 0's run folder (`--out`): checkpoints, resume and the run's files
/// live there. Rank 0 leaves a token in it and sends the token to all; a rank that finds
/// another one (or none) is on a machine that does not share the folder, and says so now
/// instead of writing checkpoints nobody will find.
pub(crate) fn check_shared_run_dir(out: &Path, pg: &ProcessGroup) -> Result<(), TrainError> {
    if pg.world_size() == 1 {
        return Ok(());
    }
    let path = RunDir::new(out).rank0_token();
    let mut token = tch::Tensor::from_slice(&[0i64]);
    if pg.rank() == 0 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let value = nanos ^ i64::from(std::process::id());
        std::fs::write(&path, value.to_string()).map_err(io(&path))?;
        token = tch::Tensor::from_slice(&[value]);
    }
    pg.broadcast(&mut token, 0, "run folder check")?.wait()?;
    let want = token.int64_value(&[0]);
    let found = std::fs::read_to_string(&path).ok();
    if found.as_deref().map(str::trim) != Some(want.to_string().as_str()) {
        return Err(TrainError::Invalid(format!(
            "rank {}: --out {} is not the run folder rank 0 writes ({} {}): with several \
             machines, --out must be a folder every node shares (checkpoints and --resume live \
             there); per-node folders are the shard cache (--cache-dir) and logs",
            pg.rank(),
            out.display(),
            path.display(),
            if found.is_some() {
                "holds another run's token"
            } else {
                "is missing here"
            },
        )));
    }
    Ok(())
}

/// Parses both model directories' configs and opens the LM's weights index, so a broken
/// directory is reported once, by the launcher, before any rank starts.
pub fn check_model_dirs(cfg: &TrainConfig) -> Result<(), tessera_model::ModelError> {
    Vlm::from_dirs(&cfg.vision, &cfg.lm, VlmOptions::default()).map(drop)
}

/// The `.safetensors` files directly in `dir`, sorted by name.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, TrainError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io(dir))?;
    files.retain(|p| p.extension().is_some_and(|e| e == "safetensors"));
    files.sort();
    Ok(files)
}

/// A model directory's weight files (`*.safetensors`, sorted by name): name, size and crc32c
/// of the bytes, hashed. Names the frozen parameters a checkpoint does not store; crc32c reads
/// a multi-GB model in about a second (from the page cache the loading just filled).
fn weights_fingerprint(dir: &Path) -> Result<String, TrainError> {
    let mut hasher = Sha256::new();
    for path in safetensors_files(dir)? {
        let mut file = std::fs::File::open(&path).map_err(io(&path))?;
        let (mut crc, mut len) = (0u32, 0u64);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = std::io::Read::read(&mut file, &mut buf).map_err(io(&path))?;
            if n == 0 {
                break;
            }
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            len += n as u64;
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        hasher.update(format!("{} {len} {crc:08x}\n", name.unwrap_or_default()).as_bytes());
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Configs by bytes, weight files by crc32c, parameters by name, shape and trainability (LoRA
/// alpha included).
pub(crate) fn model_fingerprint(
    cfg: &TrainConfig,
    vlm: &Vlm,
) -> Result<ModelFingerprint, TrainError> {
    let config_sha =
        |dir: &Path| tessera_shards::sha256_file(&dir.join("config.json")).map(|(sha, _)| sha);
    let mut params = String::new();
    for spec in vlm.whole_param_specs()? {
        params += &format!("{} {:?} {}\n", spec.name, spec.shape, spec.trainable);
    }
    if let Some(lora) = &vlm.options.lora {
        params += &format!(
            "lora_alpha {} targets {:?}\n",
            lora.lora_alpha, lora.target_modules
        );
    }
    Ok(ModelFingerprint {
        vision_config: config_sha(&cfg.vision)?,
        lm_config: config_sha(&cfg.lm)?,
        params: hex::encode(Sha256::digest(params.as_bytes())),
        vision_weights: weights_fingerprint(&cfg.vision)?,
        lm_weights: weights_fingerprint(&cfg.lm)?,
    })
}

/// The projector file to start from: the file itself, or a run directory's newest complete
/// checkpoint (format 4 keeps it in shards: its four tensors are written to `scratch` first).
/// The geometry the model's tower sees images at: its input size and patch.
pub(crate) fn tower(vlm: &Vlm) -> tessera_shards::image_layout::Tower {
    tessera_shards::image_layout::Tower {
        tile: vlm.vision.image_size as u32,
        patch: vlm.vision.patch_size as u32,
    }
}

fn init_projector_file(path: &Path, scratch: &Path) -> Result<PathBuf, TrainError> {
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    let pick = RunDir::new(path).newest_complete_checkpoint()?;
    for s in &pick.skipped {
        let run = path.display();
        tracing::warn!(
            "--init-projector {run}: skipped {}: {}",
            s.checkpoint,
            s.reason
        );
    }
    let skipped = match pick.skipped_list() {
        list if list.is_empty() => String::new(),
        list => format!(" (skipped {list})"),
    };
    let ckpt = pick.checkpoint.ok_or_else(|| ConfigError::Invalid {
        field: "init_projector",
        reason: format!(
            "run {} has no complete checkpoint to take the projector from{skipped}",
            path.display()
        ),
    })?;
    // The projector, and the added tokens' rows (trained beside it) when the run had any.
    let projector = TrainedTensors::open(&ckpt)?.collect(|k| {
        k.starts_with("mm_projector.")
            || k.starts_with("added_tokens.")
            || k == tessera_model::IMAGE_NEWLINE
    })?;
    if !projector.keys().any(|k| k.starts_with("mm_projector.")) {
        return Err(ConfigError::Invalid {
            field: "init_projector",
            reason: format!(
                "run {} did not train the projector (its checkpoint {} holds none): pass the \
                 mm_projector.safetensors of its export, or the run it started from",
                path.display(),
                ckpt.dir.display()
            ),
        }
        .into());
    }
    if let Some(dir) = scratch.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    save_safetensors(scratch, &projector)?;
    Ok(scratch.to_path_buf())
}

/// A shard set of `--shards` (the folder or URL itself, or a mixture file's source) as a
/// location, a URL with its cache (`--cache-dir`, `--cache-limit`); for a URL also its store,
/// whose requests the run counts.
fn dataset_location(
    cfg: &TrainConfig,
    spec: &str,
) -> Result<
    (
        tessera_shards::DatasetLocation,
        Option<Arc<tessera_remote::ObjectFiles>>,
    ),
    TrainError,
> {
    let limit =
        tessera_remote::parse_size(&cfg.cache_limit).map_err(|source| ConfigError::BadSize {
            field: "cache_limit",
            source,
        })?;
    let dir = cfg
        .cache_dir
        .clone()
        .or_else(|| tessera_switches::Switches::get().cache_dir.clone())
        .unwrap_or_else(|| RunDir::new(&cfg.out).shard_cache());
    let cache = tessera_remote::CacheConfig { dir, limit };
    if spec.starts_with("file://") || !tessera_remote::is_remote(spec) {
        let location = tessera_remote::open_location(spec, Some(&cache))
            .map_err(tessera_shards::ShardError::from)?;
        return Ok((location, None));
    }
    let files = tessera_remote::open_remote(spec, Some(&cache), &[])
        .map_err(tessera_shards::ShardError::from)?;
    Ok((
        tessera_shards::DatasetLocation::Remote(files.clone()),
        Some(files),
    ))
}

/// The rank, and the source its shards are read from (opened checkpoints: drop it once the
/// sharded model exists).
/// `resume`: the run continues the one in `--out` (whose records it keeps).
pub(crate) fn build(
    cfg: &TrainConfig,
    resume: bool,
    pg: ProcessGroup,
    mesh: Option<Mesh>,
    experts: Option<ExpertMesh>,
) -> Result<(Setup, VlmInit), TrainError> {
    let (rank, world_size) = (pg.rank(), pg.world_size());
    let stores = std::cell::RefCell::new(Vec::new());
    let data = TrainData::open(&cfg.shards.to_string_lossy(), &|spec| {
        let (location, store) = dataset_location(cfg, spec)?;
        stores.borrow_mut().extend(store);
        Ok(location)
    })?;
    let stores = stores.into_inner();
    let samples = data.metadata()?;
    if samples.is_empty() {
        return Err(ConfigError::Invalid {
            field: "shards",
            reason: format!("{} holds no samples", cfg.shards.display()),
        }
        .into());
    }
    let lora = cfg.train.lora.then(|| LoraConfig {
        r: cfg.lora_r as i64,
        lora_alpha: cfg.lora_alpha,
        ..LoraConfig::default()
    });
    let manifest = data.manifest();
    shard_tokenizer::check_tokenizer(manifest, &cfg.shards, &cfg.lm, rank)?;
    let lm = LmConfig::from_dir(&cfg.lm)?;
    let (expert_group, expert_replicas) = match experts {
        Some(m) => (
            Some(ExpertGroup(Arc::new(m.experts))),
            Some((m.replicas, m.replica_ranks)),
        ),
        None => (None, None),
    };
    let options = VlmOptions {
        image_token_id: Some(i64::from(manifest.special_tokens().image.id)),
        train_projector: cfg.train.projector,
        lora,
        train_lm: cfg.train.lm,
        train_vision: cfg.train.vision,
        loss_chunk: None,
        added_tokens: shard_tokenizer::added_rows(manifest, &cfg.shards, &lm)?,
        expert_parallel: expert_group,
        image_size: cfg.image_size.map(|size| size as i64),
        vision_feature_layer: Some(cfg.vision_feature_layer.clone()),
        image_layout: cfg.image_layout.clone(),
        feature_stats: None,
    };
    let vlm = Vlm::from_dirs(&cfg.vision, &cfg.lm, options.clone())?;
    // The statistics are measured on the tower the model reads, so the model is built twice.
    let vlm = match super::feature_stats::resolve(cfg, resume, &data, &samples, &vlm)? {
        Some(stats) => Vlm::from_dirs(
            &cfg.vision,
            &cfg.lm,
            VlmOptions {
                feature_stats: Some(stats),
                ..options
            },
        )?,
        None => vlm,
    };
    let scratch = cfg
        .out
        .join(format!(".init-projector-rank{rank}.safetensors"));
    let projector = cfg
        .init_projector
        .as_deref()
        .map(|p| init_projector_file(p, &scratch))
        .transpose()?;
    let device = match cfg.device {
        Device::Cpu => tch::Device::Cpu,
        Device::Cuda => dist::cuda_device_for(rank),
    };
    let init = vlm.init_source(&cfg.vision, &cfg.lm, projector.as_deref(), cfg.seed)?;
    if scratch.exists() {
        std::fs::remove_file(&scratch).map_err(io(&scratch))?;
    }
    let model_fingerprint = model_fingerprint(cfg, &vlm)?;
    let images = match cfg.image_layout {
        tessera_shards::image_layout::ImageLayout::Single => None,
        ref layout => Some(data.sample_images(layout, tower(&vlm))?),
    };
    let setup = Setup {
        pg: Arc::new(pg),
        mesh,
        expert_replicas,
        rank,
        world_size,
        data,
        stores,
        samples,
        images,
        vlm: Arc::new(vlm),
        model_fingerprint,
        device,
    };
    Ok((setup, init))
}
