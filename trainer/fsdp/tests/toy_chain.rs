//! FSDP on a toy VLM-shaped chain (frozen "vision" prefix, trainable "projector", frozen "embed"
//! whose table the "head" reuses (tied), two MLP units mixing frozen and trainable parameters):
//! W=2 over gloo (2 threads) must match W=1 on the same global batches for every strategy.
use std::time::{Duration, Instant};
use tch::{Device, Kind, Tensor};
use tessera_fsdp::dist::{local_groups, ProcessGroup};
use tessera_fsdp::{AdamWConfig, Fsdp, FsdpConfig, MemoryReport, ParamGroup, Strategy};
use tessera_fsdp::{ComputeError, ParamMap, ParamSpec, Unit};

const D: i64 = 16;
const VOCAB: i64 = 24;
const TIED: &str = "model.embed_tokens.weight";

/// One micro-batch: optional "pixels" (4 patches of D features), token ids and targets.
struct Ctx {
    pixels: Option<Tensor>,
    ids: Tensor,
    targets: Tensor,
}

struct Toy {
    name: &'static str,
    params: Vec<ParamSpec>,
}

fn spec(name: &str, shape: &[i64], trainable: bool) -> ParamSpec {
    ParamSpec {
        name: name.into(),
        shape: shape.to_vec(),
        trainable,
        expert: None,
    }
}

fn p<'a>(m: &'a ParamMap, k: &str) -> &'a Tensor {
    m.get(k).unwrap_or_else(|| panic!("missing {k}"))
}

impl Unit<Ctx> for Toy {
    fn name(&self) -> &str {
        self.name
    }
    fn params(&self) -> &[ParamSpec] {
        &self.params
    }
    fn runs_on(&self, ctx: &Ctx) -> bool {
        !matches!(self.name, "vision" | "projector") || ctx.pixels.is_some()
    }
    fn forward(&self, m: &ParamMap, x: &Tensor, ctx: &Ctx) -> Result<Tensor, ComputeError> {
        Ok(match self.name {
            "vision" => x.matmul(p(m, "vision.w")).tanh(),
            "projector" => x.matmul(p(m, "proj.w")) + p(m, "proj.b"),
            "embed" => {
                let text = p(m, TIED).index_select(0, &ctx.ids);
                if x.numel() == 0 {
                    text
                } else {
                    Tensor::cat(&[x, &text], 0)
                }
            }
            "mlp.0" | "mlp.1" => {
                let k = self.name;
                let h = x.matmul(p(m, &format!("{k}.w1"))).tanh();
                x + h.matmul(p(m, &format!("{k}.w2"))) + p(m, &format!("{k}.b"))
            }
            _ => {
                let logits = (x * p(m, "head.scale")).matmul(&p(m, TIED).tr());
                logits.cross_entropy_loss::<Tensor>(
                    &ctx.targets,
                    None,
                    tch::Reduction::Sum,
                    -100,
                    0.0,
                )
            }
        })
    }
}

fn units() -> Vec<Box<dyn Unit<Ctx>>> {
    let mlp = |k: &'static str, w1_trains: bool| Toy {
        name: k,
        params: vec![
            spec(&format!("{k}.w1"), &[D, D], w1_trains),
            spec(&format!("{k}.w2"), &[D, D], true),
            spec(&format!("{k}.b"), &[D], true),
        ],
    };
    vec![
        Box::new(Toy {
            name: "vision",
            params: vec![spec("vision.w", &[D, D], false)],
        }),
        Box::new(Toy {
            name: "projector",
            params: vec![spec("proj.w", &[D, D], true), spec("proj.b", &[D], true)],
        }),
        Box::new(Toy {
            name: "embed",
            params: vec![spec(TIED, &[VOCAB, D], false)],
        }),
        Box::new(mlp("mlp.0", false)),
        Box::new(mlp("mlp.1", true)),
        Box::new(Toy {
            name: "head",
            params: vec![
                spec(TIED, &[VOCAB, D], false),
                spec("head.scale", &[D], true),
            ],
        }),
    ]
}

/// Deterministic values for every parameter (same on every rank, no RNG state).
fn init(units: &[Box<dyn Unit<Ctx>>]) -> ParamMap {
    let mut m = ParamMap::new();
    for (k, s) in units.iter().flat_map(|u| u.params()).enumerate() {
        let n: i64 = s.shape.iter().product();
        let t = ((Tensor::arange(n, (Kind::Float, Device::Cpu)) * 0.37 + k as f64).sin() * 0.3)
            .view(s.shape.as_slice());
        let t = if s.name == "head.scale" { t + 1.0 } else { t };
        m.insert(s.name.clone(), t);
    }
    m
}

/// Micro-batch `i` of step `step`: image micro-batches on even steps, text-only on odd ones.
fn micro_batch(step: usize, i: usize, image: bool) -> (Ctx, Tensor) {
    let seed = (step * 7 + i * 3) as f64;
    let tokens = 5 + (step + i) as i64 % 4;
    let ids = ((Tensor::arange(tokens, (Kind::Float, Device::Cpu)) * 1.3 + seed)
        .sin()
        .abs()
        * (VOCAB - 1) as f64)
        .to_kind(Kind::Int64);
    let n_img = if image { 4 } else { 0 };
    let targets = ((Tensor::arange(n_img + tokens, (Kind::Float, Device::Cpu)) * 2.1 + seed)
        .cos()
        .abs()
        * (VOCAB - 1) as f64)
        .to_kind(Kind::Int64);
    let pixels = image.then(|| {
        (Tensor::arange(n_img * D, (Kind::Float, Device::Cpu)) * 0.11 + seed)
            .sin()
            .view([n_img, D])
    });
    let input = pixels.as_ref().map_or_else(
        || Tensor::zeros([0], (Kind::Float, Device::Cpu)),
        |t| t.shallow_clone(),
    );
    (
        Ctx {
            pixels,
            ids,
            targets,
        },
        input,
    )
}

fn config(strategy: Strategy) -> FsdpConfig {
    FsdpConfig {
        strategy,
        adamw: AdamWConfig {
            lr: 1e-2,
            weight_decay: 0.01,
            groups: vec![ParamGroup {
                name: "projector".into(),
                unit_prefixes: vec!["projector".into()],
                name_contains: vec![],
                lr: 3e-3,
                weight_decay: 0.0,
            }],
            ..AdamWConfig::default()
        },
        max_grad_norm: Some(0.5),
        ..FsdpConfig::default()
    }
}

struct Run {
    losses: Vec<f64>,
    params: ParamMap,
    memory: MemoryReport,
    bytes_per_step: Vec<u64>,
    across_per_step: Vec<u64>,
    seconds: f64,
}

/// `steps` optimizer steps of 2 micro-batches each; rank r of W runs micro-batches r, r+W, ...
fn train(pg: &ProcessGroup, strategy: Strategy, steps: usize) -> anyhow::Result<Run> {
    train_on(pg, None, strategy, steps, 2)
}

/// [`train`] with `micro` micro-batches per step and, for hybrid runs, this rank's (node,
/// replica) groups beside the job's `world`.
fn train_on(
    world: &ProcessGroup,
    mesh: Option<(&ProcessGroup, &ProcessGroup)>,
    strategy: Strategy,
    steps: usize,
    micro: usize,
) -> anyhow::Result<Run> {
    let units = units();
    let mut fsdp = match mesh {
        Some((node, replicas)) => Fsdp::new_hybrid(
            &units,
            world,
            node,
            replicas,
            &init(&units),
            config(strategy),
        )?,
        None => Fsdp::new(&units, world, &init(&units), config(strategy))?,
    };
    let (w, r) = (world.world_size(), world.rank());
    let mut run = Run {
        losses: vec![],
        params: ParamMap::new(),
        memory: fsdp.memory(),
        bytes_per_step: vec![],
        across_per_step: vec![],
        seconds: 0.0,
    };
    let start = Instant::now();
    for step in 0..steps {
        let batches: Vec<_> = (0..micro)
            .map(|i| micro_batch(step, i, step & 1 == 0))
            .collect();
        let tokens: i64 = batches.iter().map(|(c, _)| c.targets.size()[0]).sum();
        for (ctx, input) in batches.iter().skip(r).step_by(w) {
            fsdp.forward_backward(ctx, input, 1.0 / tokens as f64)?;
        }
        let stats = fsdp.step(1.0)?;
        run.losses.push(stats.loss);
        run.bytes_per_step.push(stats.bytes_sent);
        run.across_per_step.push(stats.bytes_sent_across);
    }
    run.seconds = start.elapsed().as_secs_f64();
    run.params = fsdp.gather_params(false)?;
    Ok(run)
}

fn train_w2(strategy: Strategy, steps: usize) -> anyhow::Result<Vec<Run>> {
    let groups = local_groups(2, Duration::from_secs(30))?;
    std::thread::scope(|s| {
        let hs: Vec<_> = groups
            .iter()
            .map(|pg| s.spawn(move || train(pg, strategy, steps)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("rank panicked"))?)
            .collect()
    })
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-8)
}

fn assert_same(reference: &Run, other: &Run, what: &str) -> anyhow::Result<()> {
    for (step, (a, b)) in other.losses.iter().zip(&reference.losses).enumerate() {
        assert!(
            rel(*a, *b) <= 1e-4,
            "{what}: step {step} loss {a} vs W=1 {b}"
        );
    }
    for (name, want) in &reference.params {
        let got = other
            .params
            .get(name)
            .ok_or_else(|| anyhow::anyhow!("{what}: {name} missing"))?;
        let diff = (got - want).abs().max().double_value(&[]);
        let scale = want.abs().max().double_value(&[]).max(1e-3);
        assert!(
            diff / scale <= 1e-4,
            "{what}: final {name} differs by {diff}"
        );
    }
    Ok(())
}

#[test]
fn every_strategy_at_two_ranks_matches_one_rank() -> anyhow::Result<()> {
    let single = ProcessGroup::single(Duration::from_secs(30))?;
    let reference = train(&single, Strategy::FullShard, 20)?;
    assert!(
        reference.losses[18] < reference.losses[0],
        "the toy does not learn: {:?}",
        reference.losses
    );
    assert!(
        reference.params["proj.w"]
            .ne_tensor(&init(&units())["proj.w"])
            .any()
            .int64_value(&[])
            == 1
    );
    for strategy in [
        Strategy::FullShard,
        Strategy::ShardGradOp,
        Strategy::NoShard,
    ] {
        let runs = train_w2(strategy, 20)?;
        for (rank, run) in runs.iter().enumerate() {
            assert_same(&reference, run, &format!("{strategy:?} rank {rank}"))?;
        }
        eprintln!(
            "{strategy:?}: W=2 {:.3}s vs W=1 {:.3}s for 20 steps",
            runs[0].seconds, reference.seconds
        );
    }
    Ok(())
}

/// Two "nodes" of two thread ranks: HYBRID_SHARD (and its ZeRO-2 form) match W=1 on the same
/// four micro-batches per step, like FULL_SHARD over all four ranks; a rank keeps half the
/// trainable state (sharded over its node); only the shard gradients' all-reduce crosses
/// nodes, fewer bytes than FULL_SHARD's collectives over the whole job.
#[test]
fn hybrid_shard_on_two_nodes_of_two_matches_one_rank_and_full_shard() -> anyhow::Result<()> {
    let t = Duration::from_secs(30);
    let single = ProcessGroup::single(t)?;
    let reference = train_on(&single, None, Strategy::FullShard, 12, 4)?;
    let world = local_groups(4, t)?;
    let full: Vec<Run> = std::thread::scope(|s| {
        let hs: Vec<_> = world
            .iter()
            .map(|pg| s.spawn(move || train_on(pg, None, Strategy::FullShard, 12, 4)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("rank panicked"))?)
            .collect::<anyhow::Result<_>>()
    })?;
    for strategy in [Strategy::HybridShard, Strategy::HybridShardZero2] {
        let world = local_groups(4, t)?;
        let nodes = [local_groups(2, t)?, local_groups(2, t)?];
        let replicas = [local_groups(2, t)?, local_groups(2, t)?];
        let runs: Vec<Run> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|r| {
                    let (node, local) = (r / 2, r % 2);
                    let mesh = (&nodes[node][local], &replicas[local][node]);
                    let world = &world[r];
                    s.spawn(move || train_on(world, Some(mesh), strategy, 12, 4))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().map_err(|_| anyhow::anyhow!("rank panicked"))?)
                .collect::<anyhow::Result<_>>()
        })?;
        for (rank, run) in runs.iter().enumerate() {
            assert_same(&reference, run, &format!("{strategy:?} rank {rank}"))?;
            let held = run.memory.trainable_param_bytes + run.memory.optimizer_bytes;
            let whole = reference.memory.trainable_param_bytes + reference.memory.optimizer_bytes;
            assert!(
                held.abs_diff(whole / 2) <= 64,
                "{strategy:?} rank {rank}: {held} bytes of trainable state, want half of {whole}"
            );
            let across: u64 = run.across_per_step.iter().sum();
            let full_total: u64 = full[rank].bytes_per_step.iter().sum();
            assert!(
                across > 0 && across < full_total,
                "{strategy:?} rank {rank}: {across} bytes across nodes vs FULL_SHARD's {full_total}"
            );
        }
        eprintln!(
            "{strategy:?}: rank 0 sends {} bytes/step across nodes, {} in all; FULL_SHARD over 4: {}",
            runs[0].across_per_step[1], runs[0].bytes_per_step[1], full[0].bytes_per_step[1]
        );
    }
    for (rank, run) in full.iter().enumerate() {
        assert_same(&reference, run, &format!("FullShard W=4 rank {rank}"))?;
    }
    Ok(())
}

#[test]
fn full_shard_halves_resident_parameter_gradient_and_optimizer_bytes() -> anyhow::Result<()> {
    let single = ProcessGroup::single(Duration::from_secs(30))?;
    let one = train(&single, Strategy::FullShard, 2)?.memory;
    for (rank, run) in train_w2(Strategy::FullShard, 2)?.iter().enumerate() {
        let two = run.memory;
        assert!(
            two.param_bytes as f64 <= 0.55 * one.param_bytes as f64,
            "rank {rank}: {two:?} vs {one:?}"
        );
        let state = |m: &MemoryReport| (m.grad_bytes + m.optimizer_bytes) as f64;
        assert!(
            state(&two) <= 0.55 * state(&one),
            "rank {rank}: {two:?} vs {one:?}"
        );
        assert!(two.grad_bytes > 0 && two.optimizer_bytes == 2 * two.grad_bytes);
    }
    Ok(())
}

/// Both ranks' error messages for a schedule where rank 0 runs an image micro-batch and rank 1
/// a text-only one.
fn misaligned(check_schedule: bool) -> anyhow::Result<(Vec<String>, Duration)> {
    let groups = local_groups(2, Duration::from_secs(3))?;
    let started = Instant::now();
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = groups
            .iter()
            .map(|pg| {
                s.spawn(move || {
                    let units = units();
                    let mut fsdp = Fsdp::new(
                        &units,
                        pg,
                        &init(&units),
                        FsdpConfig {
                            check_schedule,
                            ..config(Strategy::FullShard)
                        },
                    )?;
                    // rank 0 an image micro-batch, rank 1 a text-only one
                    let (ctx, input) = micro_batch(0, pg.rank(), pg.rank() == 0);
                    match fsdp.forward_backward(&ctx, &input, 0.1) {
                        Ok(_) => anyhow::bail!("rank {} ran a misaligned schedule", pg.rank()),
                        Err(e) => Ok(e.to_string()),
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("rank panicked"))?)
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    Ok((errors, started.elapsed()))
}

#[test]
fn misaligned_micro_batch_kinds_fail_at_once_naming_the_vision_all_gather() -> anyhow::Result<()> {
    let (errors, elapsed) = misaligned(true)?;
    for (rank, e) in errors.iter().enumerate() {
        assert!(
            e.starts_with(&format!("rank {rank}: all-gather of unit 'vision'")),
            "{e}"
        );
        assert!(
            e.contains("ranks [0] run the unit") && e.contains("ranks [1] skip it"),
            "{e}"
        );
    }
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    Ok(())
}
