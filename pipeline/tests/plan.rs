//! Planner properties over many random datasets (fixed seeds) and world sizes 1..16: type
//! alignment, every sample exactly once, budgets, loss divisors, determinism, resume and
//! elastic resume; plus the LLaVA-Pretrain-shaped quality targets and the input errors.
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_pipeline::plan::{
    synthetic_llava, Mode, OverLong, Plan, PlanError, Planner, PlannerBuilder,
};
use tessera_pipeline::MicroBatchPlan;
use tessera_shards::{Kind, SampleMeta};

/// A random dataset and planner settings that admit it.
#[derive(Clone, Debug)]
struct Case {
    samples: Vec<SampleMeta>,
    image_tokens: u32,
    world_size: usize,
    token_budget: u64,
    seq_len: u64,
    micro_steps: usize,
    seed: u64,
}

impl Case {
    fn random(rng: &mut ChaCha8Rng) -> Case {
        let seq_len = rng.gen_range(16..512u64);
        let token_budget = rng.gen_range(seq_len / 2 + 1..=seq_len * 4);
        let cap = seq_len.min(token_budget) as u32;
        let image_tokens = rng.gen_range(1..=cap / 6);
        let text_fraction = [0.0, 1.0, 0.1, 0.5][rng.gen_range(0..4)];
        let n = rng.gen_range(0..300);
        let samples = (0..n)
            .map(|_| {
                // Image samples hold one to three images (a placeholder token each).
                let (kind, num_images, num_text_tokens) = if rng.gen_bool(text_fraction) {
                    (Kind::Text, 0, rng.gen_range(1..=cap))
                } else {
                    let images = rng.gen_range(1..=3);
                    let text = rng.gen_range(images..=cap - images * image_tokens + images);
                    (Kind::Image, images, text)
                };
                SampleMeta {
                    kind,
                    num_images,
                    num_text_tokens,
                    num_supervised_tokens: rng.gen_range(0..=num_text_tokens),
                }
            })
            .collect();
        Case {
            samples,
            image_tokens,
            world_size: rng.gen_range(1..=16),
            token_budget,
            seq_len,
            micro_steps: rng.gen_range(1..=4),
            seed: rng.gen(),
        }
    }

    fn builder(&self, mode: Mode) -> PlannerBuilder {
        Planner::builder()
            .samples(&self.samples)
            .image_tokens(self.image_tokens)
            .world_size(self.world_size)
            .token_budget(self.token_budget)
            .seq_len(self.seq_len)
            .micro_steps(self.micro_steps)
            .seed(self.seed)
            .mode(mode)
            .fingerprint("property-test")
    }
}

fn real_samples<'a>(steps: impl IntoIterator<Item = &'a tessera_pipeline::plan::Step>) -> Vec<u64> {
    let mut out: Vec<u64> = steps
        .into_iter()
        .flat_map(|s| &s.micro_steps)
        .flat_map(|m| &m.ranks)
        .filter(|mb| !mb.zero_loss)
        .flat_map(|mb| mb.rows.iter().flatten().copied())
        .collect();
    out.sort_unstable();
    out
}

fn micro_batch_len(mb: &MicroBatchPlan, lens: &[u32]) -> (u64, u64) {
    let row_lens: Vec<u64> = mb
        .rows
        .iter()
        .map(|r| r.iter().map(|&s| u64::from(lens[s as usize])).sum())
        .collect();
    let longest = row_lens.iter().copied().max().unwrap_or(0);
    (longest, mb.rows.len() as u64 * longest)
}

/// Every property a single plan must have; the message names the case on failure.
fn check_plan(case: &Case, mode: Mode, planner: &Planner, plan: &Plan) {
    let lens = planner.sample_lens();
    let ctx = format!(
        "{mode:?} W={} B={} L={}",
        case.world_size, case.token_budget, case.seq_len
    );
    let all: Vec<u64> = (0..case.samples.len() as u64).collect();
    assert_eq!(
        real_samples(&plan.steps),
        all,
        "{ctx}: every sample exactly once"
    );
    for (s, (meta, &len)) in case.samples.iter().zip(lens).enumerate() {
        let images = meta.num_images;
        let expanded = meta.num_text_tokens - images + images * case.image_tokens;
        assert_eq!(
            len, expanded,
            "{ctx}: sample {s}: every image's tokens counted"
        );
    }
    assert_eq!(plan.stats.samples, case.samples.len() as u64, "{ctx}");
    for (i, step) in plan.steps.iter().enumerate() {
        let last = i + 1 == plan.steps.len();
        assert!(
            step.micro_steps.len() == case.micro_steps
                || (last && step.micro_steps.len() < case.micro_steps),
            "{ctx}: step {i} has {} micro-steps",
            step.micro_steps.len()
        );
        let mut supervised = 0u64;
        for ms in &step.micro_steps {
            assert_eq!(
                ms.ranks.len(),
                case.world_size,
                "{ctx}: one micro-batch per rank"
            );
            if mode != Mode::Fixed {
                assert!(
                    ms.kind().is_some(),
                    "{ctx}: step {i} mixes kinds across ranks"
                );
            }
            for mb in &ms.ranks {
                assert!(
                    !mb.rows.is_empty() && mb.rows.iter().all(|r| !r.is_empty()),
                    "{ctx}: empty micro-batch"
                );
                let (longest, padded) = micro_batch_len(mb, lens);
                assert!(longest <= case.seq_len, "{ctx}: row of {longest} tokens");
                assert!(
                    padded <= case.token_budget,
                    "{ctx}: micro-batch of {padded} tokens"
                );
                for &s in mb.rows.iter().flatten() {
                    let kind = case.samples[s as usize].kind;
                    if mode == Mode::Fixed {
                        assert!(kind == mb.kind || mb.kind == Kind::Image, "{ctx}");
                    } else {
                        assert_eq!(
                            kind, mb.kind,
                            "{ctx}: sample {s} in a {:?} micro-batch",
                            mb.kind
                        );
                    }
                    if !mb.zero_loss {
                        supervised += u64::from(case.samples[s as usize].num_supervised_tokens);
                    }
                }
                if mode != Mode::Pack {
                    assert!(
                        mb.rows.iter().all(|r| r.len() == 1),
                        "{ctx}: {mode:?} packed a row"
                    );
                }
            }
        }
        assert_eq!(
            step.supervised_tokens, supervised,
            "{ctx}: step {i} loss divisor"
        );
    }
}

#[test]
fn random_datasets_plan_every_sample_once_type_aligned_within_budget() -> anyhow::Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let (mut fillers, mut multi_sample_rows, mut mixed_fixed) = (0, 0, 0);
    for _ in 0..150 {
        let case = Case::random(&mut rng);
        for mode in Mode::ALL {
            let planner = case.builder(mode).build()?;
            let plan = planner.plan();
            fillers += plan.stats.filler_micro_batches;
            let micro_steps = || plan.steps.iter().flat_map(|s| &s.micro_steps);
            multi_sample_rows += micro_steps()
                .flat_map(|m| &m.ranks)
                .flat_map(|mb| &mb.rows)
                .filter(|r| r.len() > 1)
                .count();
            mixed_fixed += micro_steps().filter(|m| m.kind().is_none()).count();
            check_plan(&case, mode, &planner, &plan);
            assert_eq!(
                plan,
                case.builder(mode).build()?.plan(),
                "{mode:?}: deterministic"
            );
            if mode != Mode::Fixed {
                assert_eq!(
                    plan.stats.type_aligned,
                    if plan.steps.is_empty() { 0.0 } else { 1.0 }
                );
            }
        }
    }
    // The generator reaches the interesting cases: kinds running out, packing, and the naive
    // baseline mixing kinds across ranks (which is what `pack` and `bucket` must never do).
    assert!(fillers > 0 && multi_sample_rows > 0 && mixed_fixed > 0);
    Ok(())
}

#[test]
fn resuming_at_any_step_repeats_the_remaining_steps() -> anyhow::Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    for _ in 0..100 {
        let case = Case::random(&mut rng);
        for mode in Mode::ALL {
            let planner = case.builder(mode).build()?;
            let plan = planner.plan();
            let k = rng.gen_range(0..=plan.steps.len());
            let rest = planner.plan_from(&plan.resume_position(k)?)?;
            assert_eq!(rest.steps, plan.steps[k..], "{mode:?} resume at step {k}");
            assert_eq!(rest.end, plan.end);
        }
    }
    Ok(())
}

#[test]
fn elastic_resume_with_another_world_size_plans_every_sample_once() -> anyhow::Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(43);
    for i in 0..120 {
        let mut case = Case::random(&mut rng);
        // The scenario first (4 ranks, then 2), then random pairs in 1..16.
        let (before, after) = if i < 20 {
            (4, 2)
        } else {
            (rng.gen_range(1..=16), rng.gen_range(1..=16))
        };
        for mode in Mode::ALL {
            case.world_size = before;
            let plan = case.builder(mode).build()?.plan();
            let k = rng.gen_range(0..=plan.steps.len());
            case.world_size = after;
            let planner = case.builder(mode).build()?;
            let rest = planner.plan_from(&plan.resume_position(k)?)?;
            check_plan_after_resume(&case, mode, &plan, k, &rest);
            assert_eq!(rest.world_size, after);
            assert!(rest
                .steps
                .iter()
                .flat_map(|s| &s.micro_steps)
                .all(|m| m.ranks.len() == after));
            if let Some(first) = rest.steps.first() {
                assert_eq!(first.index, k as u64, "resumed steps keep counting");
            }
        }
    }
    Ok(())
}

fn check_plan_after_resume(case: &Case, mode: Mode, before: &Plan, k: usize, rest: &Plan) {
    let mut seen = real_samples(&before.steps[..k]);
    seen.extend(real_samples(&rest.steps));
    seen.sort_unstable();
    let all: Vec<u64> = (0..case.samples.len() as u64).collect();
    assert_eq!(
        seen, all,
        "{mode:?}: W {} -> {} at step {k}",
        before.world_size, rest.world_size
    );
}

#[test]
fn llava_pretrain_shape_meets_the_pad_balance_and_alignment_targets() -> anyhow::Result<()> {
    let samples = synthetic_llava(60_000, 0.1, 3);
    let stats_of = |mode| -> anyhow::Result<_> {
        let planner = Planner::builder()
            .samples(&samples)
            .world_size(8)
            .token_budget(8192)
            .mode(mode)
            .fingerprint("llava-like")
            .build()?;
        Ok(planner.plan().stats)
    };
    let pack = stats_of(Mode::Pack)?;
    let fixed = stats_of(Mode::Fixed)?;
    assert!(pack.pad_fraction <= 0.02, "pack pad {}", pack.pad_fraction);
    assert!(
        pack.imbalance_mean <= 1.03,
        "pack imbalance {}",
        pack.imbalance_mean
    );
    assert_eq!(pack.type_aligned, 1.0);
    // The baseline computes more tokens for the same samples, and ranks wait on each other.
    assert!(
        fixed.computed_tokens > pack.computed_tokens,
        "{fixed:?} vs {pack:?}"
    );
    assert!(fixed.imbalance_mean > pack.imbalance_mean);
    Ok(())
}

#[test]
fn epochs_and_seeds_reshuffle_but_keep_the_sample_set() -> anyhow::Result<()> {
    let samples = synthetic_llava(3_000, 0.2, 5);
    let plan = |seed, epoch| -> anyhow::Result<Plan> {
        Ok(Planner::builder()
            .samples(&samples)
            .world_size(2)
            .seed(seed)
            .epoch(epoch)
            .fingerprint("f")
            .build()?
            .plan())
    };
    let base = plan(1, 0)?;
    for other in [plan(1, 1)?, plan(2, 0)?] {
        assert_ne!(other.steps[0].micro_steps, base.steps[0].micro_steps);
        assert_eq!(real_samples(&other.steps), real_samples(&base.steps));
    }
    Ok(())
}

#[test]
fn only_one_kind_plans_each_of_its_samples_once_and_nothing_else() -> anyhow::Result<()> {
    let samples = synthetic_llava(2_000, 0.2, 9);
    let images: Vec<u64> = (0..samples.len() as u64)
        .filter(|&i| samples[i as usize].kind == Kind::Image)
        .collect();
    for mode in [Mode::Pack, Mode::Bucket, Mode::Fixed] {
        let builder = Planner::builder()
            .samples(&samples)
            .world_size(3)
            .token_budget(4096)
            .mode(mode)
            .fingerprint("f");
        let planner = builder.clone().only(Some(Kind::Image)).build()?;
        let plan = planner.plan();
        assert_eq!(real_samples(&plan.steps), images, "{mode:?}");
        let kinds = plan.steps.iter().flat_map(|s| &s.micro_steps);
        for micro in kinds.flat_map(|m| &m.ranks) {
            assert_eq!(
                micro.kind,
                Kind::Image,
                "{mode:?}: a text micro-batch was planned"
            );
        }
        let half = plan.resume_position(plan.steps.len() / 2)?;
        let rest = planner.plan_from(&half)?;
        assert_eq!(
            rest.steps[..],
            plan.steps[plan.steps.len() / 2..],
            "{mode:?}"
        );
        // A position from the plan over all kinds is refused, not misread.
        let foreign = builder.build()?.plan().resume_position(1)?;
        assert!(
            planner.plan_from(&foreign).is_err(),
            "{mode:?}: took a position of the unfiltered order"
        );
    }
    Ok(())
}

/// The error `build()` must return; a planner built from bad input fails the test.
fn build_err(builder: PlannerBuilder) -> PlanError {
    match builder.build() {
        Ok(_) => panic!("build() accepted invalid input"),
        Err(err) => err,
    }
}

#[test]
fn bad_settings_and_samples_are_reported_by_name() -> anyhow::Result<()> {
    let ok = SampleMeta {
        kind: Kind::Image,
        num_images: 1,
        num_text_tokens: 20,
        num_supervised_tokens: 18,
    };
    let long = SampleMeta {
        kind: Kind::Text,
        num_images: 0,
        num_text_tokens: 3000,
        num_supervised_tokens: 10,
    };
    let base = || Planner::builder().samples(&[ok, ok, long]).fingerprint("f");
    let err = build_err(base().token_budget(0));
    assert_eq!(err.to_string(), "token budget 0 is not a budget");
    let err = build_err(base().seq_len(2048));
    assert_eq!(
        err,
        PlanError::SampleTooLong {
            index: 2,
            len: 3000,
            limit: 2048,
            limit_name: "sequence length"
        }
    );
    assert!(err
        .to_string()
        .starts_with("sample 2: 3000 tokens exceed the sequence length (2048)"));
    let empty = SampleMeta {
        kind: Kind::Image,
        num_images: 1,
        num_text_tokens: 0,
        num_supervised_tokens: 0,
    };
    let err = build_err(Planner::builder().samples(&[ok, empty]));
    assert!(err.to_string().starts_with("sample 1:"), "{err}");
    // Two images need two placeholders; a text sample holds none.
    let short = SampleMeta {
        num_images: 2,
        num_text_tokens: 1,
        ..ok
    };
    let err = build_err(Planner::builder().samples(&[short]));
    assert!(
        err.to_string()
            .starts_with("sample 0: Image sample with 2 images"),
        "{err}"
    );
    let text_with_image = SampleMeta {
        kind: Kind::Text,
        ..ok
    };
    let err = build_err(Planner::builder().samples(&[ok, text_with_image]));
    assert!(
        err.to_string()
            .starts_with("sample 1: Text sample with 1 images"),
        "{err}"
    );
    // Three images of 729 tokens: one row of 2,190 tokens, never split, so over 2048 it is
    // refused rather than cut.
    let three = SampleMeta {
        num_images: 3,
        num_text_tokens: 6,
        ..ok
    };
    let err = build_err(Planner::builder().samples(&[three]).token_budget(8192));
    assert_eq!(
        err,
        PlanError::SampleTooLong {
            index: 0,
            len: 3 * 729 + 3,
            limit: 2048,
            limit_name: "sequence length"
        }
    );
    assert_eq!(
        build_err(base().world_size(0).seq_len(4096)),
        PlanError::ZeroWorldSize
    );

    // A position from another epoch or dataset order is refused, not silently misapplied.
    let planner = Planner::builder()
        .samples(&[ok, ok])
        .fingerprint("a")
        .build()?;
    let position = planner.plan().resume_position(0)?;
    let other = Planner::builder()
        .samples(&[ok, ok])
        .fingerprint("b")
        .build()?;
    assert!(matches!(
        other.plan_from(&position),
        Err(PlanError::OrderMismatch { .. })
    ));
    let next_epoch = Planner::builder()
        .samples(&[ok, ok])
        .fingerprint("a")
        .epoch(1)
        .build()?;
    assert!(matches!(
        next_epoch.plan_from(&position),
        Err(PlanError::EpochMismatch { .. })
    ));
    Ok(())
}

#[test]
fn an_image_kind_running_out_is_completed_with_zero_loss_image_copies() -> anyhow::Result<()> {
    // 3 images and 40 text samples on 8 ranks: the image micro-step must still give every
    // rank an image (5 zero-loss copies), and no text sample may stand in for one.
    let image = SampleMeta {
        kind: Kind::Image,
        num_images: 1,
        num_text_tokens: 10,
        num_supervised_tokens: 8,
    };
    let text = SampleMeta {
        kind: Kind::Text,
        num_images: 0,
        num_text_tokens: 300,
        num_supervised_tokens: 100,
    };
    let mut samples = vec![image; 3];
    samples.extend(vec![text; 40]);
    let plan = Planner::builder()
        .samples(&samples)
        .world_size(8)
        .fingerprint("f")
        .build()?
        .plan();
    let image_steps: Vec<_> = plan
        .steps
        .iter()
        .flat_map(|s| &s.micro_steps)
        .filter(|m| m.kind() == Some(Kind::Image))
        .collect();
    assert_eq!(image_steps.len(), 1);
    let fillers: Vec<_> = image_steps[0]
        .ranks
        .iter()
        .filter(|mb| mb.zero_loss)
        .collect();
    assert_eq!(fillers.len(), 5);
    for mb in fillers {
        assert!(
            mb.rows.iter().flatten().all(|&s| s < 3),
            "filler carries an image sample"
        );
    }
    assert_eq!(plan.stats.samples, 43);
    Ok(())
}

#[test]
fn over_long_samples_are_skipped_by_every_rank_and_resume_stays_exact() -> anyhow::Result<()> {
    // 300 samples, three of them longer than a row: with `skip` the plan holds every other
    // sample exactly once, the three are listed with their lengths, and a W=2 plan resumed at
    // W=1 (or W=3) halfway finishes the same set.
    let mut samples = synthetic_llava(300, 0.2, 5);
    for &i in &[7usize, 150, 299] {
        samples[i] = SampleMeta {
            kind: Kind::Text,
            num_images: 0,
            num_text_tokens: 40_000 + i as u32,
            num_supervised_tokens: 40,
        };
    }
    let builder = |w: usize| {
        Planner::builder()
            .samples(&samples)
            .world_size(w)
            .token_budget(4096)
            .seq_len(2048)
            .micro_steps(2)
            .fingerprint("over-long")
    };
    let err = build_err(builder(2));
    assert!(
        matches!(err, PlanError::SampleTooLong { index: 7, .. }),
        "fail is the planner's default: {err}"
    );
    let planner = builder(2).over_long(OverLong::Skip).build()?;
    let skipped: Vec<(u64, u64, u64)> = planner
        .skipped()
        .iter()
        .map(|s| (s.index, s.tokens, s.limit))
        .collect();
    assert_eq!(
        skipped,
        [(7, 40_007, 2048), (150, 40_150, 2048), (299, 40_299, 2048)]
    );
    let plan = planner.plan();
    let want: Vec<u64> = (0..300u64).filter(|i| ![7, 150, 299].contains(i)).collect();
    assert_eq!(real_samples(&plan.steps), want);
    for k in [1, plan.steps.len() / 2, plan.steps.len() - 1] {
        for after in [1, 3] {
            let rest = builder(after)
                .over_long(OverLong::Skip)
                .build()?
                .plan_from(&plan.resume_position(k)?)?;
            let mut done = real_samples(&plan.steps[..k]);
            done.extend(real_samples(&rest.steps));
            done.sort_unstable();
            assert_eq!(done, want, "resumed at step {k} with W={after}");
        }
    }
    // Without over-long samples the order is the one a build without the policy makes (a
    // position from a run that predates the flag stays valid).
    let clean = synthetic_llava(300, 0.2, 5);
    let a = Planner::builder()
        .samples(&clean)
        .fingerprint("f")
        .build()?
        .plan();
    let b = Planner::builder()
        .samples(&clean)
        .fingerprint("f")
        .over_long(OverLong::Skip)
        .build()?
        .plan();
    assert_eq!(real_samples(&a.steps), real_samples(&b.steps));
    assert_eq!(a.resume_position(1)?, b.resume_position(1)?);
    Ok(())
}

/// With each sample's images given (as `tessera_shards::sample_images` counts them under a layout),
/// a sample's length is its text plus those tokens, over-long ones are measured by them, and
/// every sample is still planned once, type-aligned, within the budget.
#[test]
fn per_sample_image_tokens_set_the_lengths() -> anyhow::Result<()> {
    use tessera_shards::SampleImages;
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let n = 400;
    let samples: Vec<SampleMeta> = (0..n)
        .map(|i| {
            let images = if i % 10 == 0 {
                0
            } else {
                1 + u32::from(i % 7 == 0)
            };
            SampleMeta {
                kind: if images == 0 { Kind::Text } else { Kind::Image },
                num_images: images,
                num_text_tokens: rng.gen_range(20..200) + images,
                num_supervised_tokens: 10,
            }
        })
        .collect();
    // AnyRes-like: 729 to about 7,300 tokens an image, 2 to 26 tiles.
    let images: Vec<SampleImages> = samples
        .iter()
        .map(|s| {
            let tiles: u32 = (0..s.num_images).map(|_| rng.gen_range(2..=26)).sum();
            SampleImages {
                tokens: u64::from(tiles) * 280 + u64::from(s.num_images) * 729,
                tiles,
            }
        })
        .collect();
    let planner = Planner::builder()
        .samples(&samples)
        .sample_images(images.clone())
        .world_size(4)
        .token_budget(16384)
        .seq_len(16384)
        .seed(2)
        .build()?;
    for (i, (s, im)) in samples.iter().zip(&images).enumerate() {
        let want = u64::from(s.num_text_tokens) - u64::from(s.num_images) + im.tokens;
        anyhow::ensure!(
            u64::from(planner.sample_lens()[i]) == want,
            "sample {i}: {} tokens planned, {want} counted",
            planner.sample_lens()[i]
        );
    }
    let plan = planner.plan();
    anyhow::ensure!(real_samples(&plan.steps) == (0..n).collect::<Vec<u64>>());
    anyhow::ensure!(plan.stats.type_aligned == 1.0, "{:?}", plan.stats);
    // A row limit below the longest sample: those samples are skipped by their counted length.
    let longest = *planner.sample_lens().iter().max().unwrap_or(&0);
    let skipping = Planner::builder()
        .samples(&samples)
        .sample_images(images.clone())
        .token_budget(u64::from(longest) - 1)
        .seq_len(u64::from(longest) - 1)
        .over_long(OverLong::Skip)
        .build()?;
    anyhow::ensure!(!skipping.skipped().is_empty());
    anyhow::ensure!(skipping
        .skipped()
        .iter()
        .all(|s| s.tokens >= u64::from(longest)));
    // One count per sample, or the builder refuses.
    let err = Planner::builder()
        .samples(&samples)
        .sample_images(images[..3].to_vec())
        .build()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    anyhow::ensure!(
        err.contains("3 samples' image counts for 400 samples"),
        "{err}"
    );
    Ok(())
}
