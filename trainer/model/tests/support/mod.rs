//! Shared helpers of the model and FSDP tests: tiny configs, random parameters, micro-batches built by
//! hand (the loader is not involved), and a float comparison with an explicit tolerance.
#![allow(dead_code)]
use tch::Tensor;
use tessera_batch::{MicroBatch, IGNORE_INDEX};
use tessera_fsdp::dist::{local_groups, ProcessGroup};
use tessera_fsdp::ParamMap;
use tessera_model::testing::random_params;
use tessera_model::{LmConfig, LmFamily, LoraConfig, VisionConfig, Vlm, VlmCtx, VlmOptions};
use tessera_shards::Kind as SampleKind;

/// Placeholder id of the tiny test vocabulary.
pub(crate) const IMAGE_ID: i64 = 299;
pub(crate) const VOCAB: i64 = 300;

pub(crate) fn tiny_vision() -> VisionConfig {
    VisionConfig {
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 3,
        num_attention_heads: 4,
        num_channels: 3,
        image_size: 16,
        patch_size: 4,
        hidden_act: "gelu_pytorch_tanh".into(),
        layer_norm_eps: 1e-6,
        arch: tessera_model::VisionArch::Siglip,
        feature_layers: tessera_model::FeatureLayers::default(),
    }
}

pub(crate) fn tiny_lm() -> LmConfig {
    tiny_lm_of(LmFamily::Qwen2)
}

/// The tiny LM with `family`'s switches (Qwen3: q/k norms and a head_dim of 16, twice
/// hidden/heads; Llama: no bias; Qwen3-MoE: one sparse layer of 4 experts, one dense).
pub(crate) fn tiny_lm_of(family: LmFamily) -> LmConfig {
    let mut config = serde_json::json!({
        "model_type": family.model_type(), "vocab_size": VOCAB, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rope_theta": 10000.0,
    });
    if family == LmFamily::Qwen3 {
        config["head_dim"] = 16.into();
    }
    if family == LmFamily::Qwen3Moe {
        // Layer 0 sparse (4 experts, top-2, renormalised), layer 1 dense; a balance weight far
        // above the default so its gradient is more than rounding.
        let moe = serde_json::json!({
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
            "norm_topk_prob": true, "mlp_only_layers": [1], "router_aux_loss_coef": 0.05,
        });
        for (k, v) in moe.as_object().expect("an object") {
            config[k] = v.clone();
        }
    }
    LmConfig::from_json(config, std::path::Path::new("tiny_lm")).expect("tiny LM config parses")
}

/// Tiny VLM (tied head) and random parameters (std 0.1, so every weight matters).
pub(crate) fn tiny_vlm(lora: Option<LoraConfig>) -> (Vlm, ParamMap) {
    let options = VlmOptions {
        image_token_id: Some(IMAGE_ID),
        lora,
        loss_chunk: Some(5),
        ..Default::default()
    };
    let vlm = Vlm::new(tiny_vision(), tiny_lm(), true, options).expect("tiny VLM builds");
    let params = random_params(&vlm.param_specs(), 7, 0.1);
    (vlm, params)
}

/// One sample: ids (image placeholders already expanded), shifted labels, and its image.
#[derive(Clone)]
pub(crate) struct TestSample {
    pub ids: Vec<i64>,
    pub labels: Vec<i64>,
    pub image: Option<Vec<u8>>,
}

/// Text sample of `len` tokens from `seed`, every next token supervised except the last.
pub(crate) fn text_sample(len: usize, seed: i64) -> TestSample {
    let ids: Vec<i64> = (0..len as i64)
        .map(|i| (seed * 31 + i * 17) % (VOCAB - 1))
        .collect();
    let mut labels: Vec<i64> = ids[1..].to_vec();
    labels.push(IGNORE_INDEX);
    TestSample {
        ids,
        labels,
        image: None,
    }
}

/// Image sample: 2 text tokens, `tokens` placeholders, a caption of `caption` tokens; labels
/// supervise the caption (the last placeholder predicts its first token).
pub(crate) fn image_sample(tokens: usize, caption: usize, seed: i64, side: usize) -> TestSample {
    let mut ids = vec![5 + seed, 6];
    ids.extend(std::iter::repeat_n(IMAGE_ID, tokens));
    let first_caption = ids.len();
    ids.extend((0..caption as i64).map(|i| (seed * 13 + i * 7 + 11) % (VOCAB - 1)));
    let labels: Vec<i64> = (0..ids.len())
        .map(|t| {
            if t + 1 >= first_caption && t + 1 < ids.len() {
                ids[t + 1]
            } else {
                IGNORE_INDEX
            }
        })
        .collect();
    let image = (0..3 * side * side)
        .map(|i| ((i as i64 * 37 + seed * 101) % 256) as u8)
        .collect();
    TestSample {
        ids,
        labels,
        image: Some(image),
    }
}

/// Packs `rows` (each a list of samples) into one micro-batch, padding rows to the longest.
pub(crate) fn micro_batch(
    rows: &[Vec<TestSample>],
    image_size: usize,
    image_tokens: usize,
) -> MicroBatch {
    let row_len = rows
        .iter()
        .map(|r| r.iter().map(|s| s.ids.len()).sum::<usize>())
        .max()
        .unwrap_or(0);
    let mut mb = MicroBatch {
        kind: SampleKind::Text,
        rows: rows.len(),
        row_len,
        input_ids: vec![],
        labels: vec![],
        positions: vec![],
        segment_ids: vec![],
        pixels: vec![],
        num_images: 0,
        image_size,
        image_tokens,
        image_geometry: Vec::new(),
        sample_ids: vec![],
        sample_sources: vec![],
        real_tokens: 0,
        pad_tokens: 0,
        supervised_tokens: 0,
        zero_loss: false,
    };
    for row in rows {
        let mut used = 0;
        for (seg, s) in row.iter().enumerate() {
            mb.input_ids.extend(&s.ids);
            mb.labels.extend(&s.labels);
            mb.positions.extend(0..s.ids.len() as i64);
            mb.segment_ids
                .extend(std::iter::repeat_n(seg as i32, s.ids.len()));
            if let Some(img) = &s.image {
                mb.pixels.extend(img);
                mb.num_images += 1;
                mb.kind = SampleKind::Image;
            }
            mb.sample_ids.push(format!("s{}", mb.sample_ids.len()));
            used += s.ids.len();
        }
        let pad = row_len - used;
        mb.input_ids.extend(std::iter::repeat_n(0, pad));
        mb.labels.extend(std::iter::repeat_n(IGNORE_INDEX, pad));
        mb.positions.extend(std::iter::repeat_n(0, pad));
        mb.segment_ids.extend(std::iter::repeat_n(-1, pad));
        mb.real_tokens += used;
        mb.pad_tokens += pad;
    }
    mb.supervised_tokens = mb.labels.iter().filter(|&&l| l != IGNORE_INDEX).count();
    mb
}

/// Largest absolute difference between two float tensors of the same shape.
pub(crate) fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shapes differ");
    (a - b).abs().max().double_value(&[])
}

/// Fails with both values when `a` and `b` differ by more than `tol` anywhere.
pub(crate) fn assert_close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    let diff = max_abs_diff(a, b);
    assert!(
        diff <= tol,
        "{what}: max |difference| {diff:e} exceeds {tol:e}"
    );
}

/// Runs the chain's units that run on `ctx` from `first` through the unit named `last` and
/// returns its output: `first` is a unit's input, `last` a unit's name.
pub(crate) fn run_units(
    vlm: &Vlm,
    params: &ParamMap,
    ctx: &VlmCtx,
    first: (&str, Tensor),
    last: &str,
) -> Result<Tensor, tessera_fsdp::ComputeError> {
    let units = vlm.units();
    let position = |name: &str| {
        units
            .iter()
            .position(|u| u.name() == name)
            .unwrap_or_else(|| panic!("no unit named {name}"))
    };
    let (from, mut x) = (position(first.0), first.1);
    for unit in &units[from..=position(last)] {
        if unit.runs_on(ctx) {
            x = unit.forward(params, &x, ctx)?;
        }
    }
    Ok(x)
}

/// The contexts of one optimizer step's `batches` (each sharing the router's balance loss over
/// the step and following `fsdp`'s recompute policy, as the trainer sets them) and the step's
/// supervised tokens, the loss divisor.
pub(crate) fn step_contexts(
    fsdp: &tessera_fsdp::Fsdp<VlmCtx>,
    vlm: &Vlm,
    batches: &[MicroBatch],
) -> anyhow::Result<(Vec<VlmCtx>, i64)> {
    let mut ctxs: Vec<VlmCtx> = batches
        .iter()
        .map(|mb| vlm.ctx(&ParamMap::new(), mb))
        .collect::<Result<_, _>>()?;
    for ctx in &mut ctxs {
        ctx.share_balance_loss(vlm.lm.router_aux_loss_coef(), batches.len());
        ctx.set_recompute_cheap_ops(fsdp.recompute().recomputes_cheap_ops());
    }
    let tokens = ctxs.iter().map(|c| c.supervised).sum();
    Ok((ctxs, tokens))
}

/// One optimizer step over `batches`, split over the group's ranks (rank r runs micro-batches
/// r, r + W, ...), each scaled by the supervised tokens of the whole step, as the trainer does.
pub(crate) fn fsdp_step(
    fsdp: &mut tessera_fsdp::Fsdp<VlmCtx>,
    vlm: &Vlm,
    pg: &tessera_fsdp::dist::ProcessGroup,
    batches: &[MicroBatch],
) -> anyhow::Result<tessera_fsdp::StepStats> {
    let (ctxs, tokens) = step_contexts(fsdp, vlm, batches)?;
    for ctx in ctxs.iter().skip(pg.rank()).step_by(pg.world_size()) {
        fsdp.forward_backward(ctx, &ctx.first_input(), 1.0 / tokens as f64)?;
    }
    Ok(fsdp.step(1.0)?)
}

pub(crate) fn scalar(t: &Tensor) -> f64 {
    t.double_value(&[])
}

/// A text micro-batch from flat row-major `[rows, row_len]` ids, shifted labels and
/// positions: one sample per row, no padding.
pub(crate) fn raw_text_batch(
    rows: usize,
    row_len: usize,
    ids: Vec<i64>,
    labels: Vec<i64>,
    positions: Vec<i64>,
) -> MicroBatch {
    let supervised = labels.iter().filter(|&&l| l != IGNORE_INDEX).count();
    MicroBatch {
        kind: SampleKind::Text,
        rows,
        row_len,
        input_ids: ids,
        labels,
        positions,
        segment_ids: vec![0; rows * row_len],
        pixels: vec![],
        num_images: 0,
        image_size: 0,
        image_tokens: 0,
        image_geometry: Vec::new(),
        sample_ids: (0..rows).map(|r| format!("row{r}")).collect(),
        sample_sources: vec![],
        real_tokens: rows * row_len,
        pad_tokens: 0,
        supervised_tokens: supervised,
        zero_loss: false,
    }
}

pub(crate) fn to_i64(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.flatten(0, -1).to_kind(tch::Kind::Int64))
        .expect("tensor converts to i64")
}

/// Runs `f` once per rank of `groups`, each rank on its own thread with its own handles on
/// `init`'s storage (tch tensors are Send but not Sync); results come back in rank order.
pub(crate) fn on_thread_ranks<T: Send>(
    groups: &[tessera_fsdp::dist::ProcessGroup],
    init: &ParamMap,
    f: impl Fn(&ParamMap, &tessera_fsdp::dist::ProcessGroup) -> anyhow::Result<T> + Sync,
) -> anyhow::Result<Vec<T>> {
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .iter()
            .map(|pg| {
                let own: ParamMap = init
                    .iter()
                    .map(|(k, v)| (k.clone(), v.shallow_clone()))
                    .collect();
                s.spawn(move || f(&own, pg))
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("rank {rank} panicked"))?
            })
            .collect()
    })
}

/// The groups of `w` thread ranks with EP=2: rank r's expert group is ranks {2⌊r/2⌋, +1}
/// (it holds experts 2(r mod 2) and 2(r mod 2)+1), its expert-replica group the ranks
/// r mod 2 + {0, 2, ...} that hold the same experts.
pub(crate) fn expert_groups(
    w: usize,
    t: std::time::Duration,
) -> anyhow::Result<Vec<(ProcessGroup, ProcessGroup)>> {
    let mut ep: Vec<Vec<ProcessGroup>> = (0..w / 2)
        .map(|_| local_groups(2, t))
        .collect::<Result<_, _>>()?;
    let mut replicas: Vec<Vec<ProcessGroup>> = (0..2)
        .map(|_| local_groups(w / 2, t))
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for r in (0..w).rev() {
        let e = ep[r / 2]
            .pop()
            .ok_or_else(|| anyhow::anyhow!("expert group"))?;
        let p = replicas[r % 2]
            .pop()
            .ok_or_else(|| anyhow::anyhow!("replica group"))?;
        out.push((e, p));
    }
    out.reverse();
    Ok(out)
}

/// The job ranks of rank `r`'s expert-replica group at EP=2.
pub(crate) fn replica_ranks(w: usize, r: usize) -> Vec<usize> {
    (0..w / 2).map(|i| r % 2 + 2 * i).collect()
}

/// The repository's root.
pub(crate) fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The golden tiny SigLIP tower the parity tests pair with their LMs.
pub(crate) fn golden_vision() -> std::path::PathBuf {
    repo().join("tests/fixtures/golden/vision")
}

/// `map[key]`, failing the test naming the key.
pub(crate) fn get<'a>(map: &'a ParamMap, key: &str) -> &'a Tensor {
    map.get(key)
        .unwrap_or_else(|| panic!("outputs have no `{key}`"))
}

/// Runs the transformers oracle `script` (a path under the repo, in scripts/setup/setup.sh's
/// `.deps/hfvenv`) into a fresh kept folder and returns it; callers keep it in a `OnceLock` so
/// it runs once per test binary.
pub(crate) fn run_oracle(script: &str) -> std::path::PathBuf {
    let dir = tempfile::tempdir().expect("a temporary folder").keep();
    let output = std::process::Command::new(repo().join(".deps/hfvenv/bin/python"))
        .arg(repo().join(script))
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    assert!(
        output.status.success(),
        "{script} failed (run scripts/setup/setup.sh for .deps/hfvenv): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    dir
}
