//! The run's TensorBoard scalars: rank 0 writes one event per step into an
//! `events.out.tfevents.*` file beside `metrics.jsonl` (`event_file.rs`), the same numbers
//! as the step's metrics line, under these tags (TensorBoard groups a tag's cards by the part
//! before its `/`):
//!
//! | tag | `metrics.jsonl` key |
//! |---|---|
//! | `loss/all`, `loss/image`, `loss/text_only`, `loss/validation` | `loss`, `loss_image`, `loss_text`, `val_loss` |
//! | `loss_by_source/{name}` (a mixture's sources) | `loss_by_source.{name}` |
//! | `optimizer/lr`, `optimizer/grad_norm` | `lr`, `grad_norm` |
//! | `throughput/tokens_per_s`, `throughput/real_tokens_per_s`, `throughput/images_per_s` | the same |
//! | `time/step_s`, `time/imbalance` | `step_time_s`, `imbalance` |
//! | `loader_wait_frac/rank{r}`, `compute_s/rank{r}`, `peak_rss_mib/rank{r}` | `per_rank.*[r]` |
//!
//! A step without image (text-only) micro-batches has no `loss/image` (`loss/text_only`)
//! point; `loss/validation` has points at the evaluated steps. Values are stored as f32, as
//! every TensorBoard scalar is. `tensorboard --logdir runs/` shows every run below `runs/`.
use crate::report::metrics::StepMetrics;

/// The tagged scalars of one step.
pub(crate) fn scalars(m: &StepMetrics) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = vec![("loss/all".into(), m.loss)];
    let optional = [
        ("loss/image", m.loss_image),
        ("loss/text_only", m.loss_text),
        ("loss/validation", m.val_loss),
    ];
    out.extend(
        optional
            .into_iter()
            .filter_map(|(tag, v)| v.map(|v| (tag.to_string(), v))),
    );
    out.extend(
        m.loss_by_source
            .iter()
            .map(|(name, &v)| (format!("loss_by_source/{name}"), v)),
    );
    let always = [
        ("optimizer/lr", m.lr),
        ("optimizer/grad_norm", m.grad_norm),
        ("throughput/tokens_per_s", m.tokens_per_s),
        ("throughput/real_tokens_per_s", m.real_tokens_per_s),
        ("throughput/images_per_s", m.images_per_s),
        ("time/step_s", m.step_time_s),
        ("time/imbalance", m.imbalance),
    ];
    out.extend(always.into_iter().map(|(tag, v)| (tag.to_string(), v)));
    if let Some(moe) = &m.moe {
        out.push(("moe/aux_loss".into(), moe.aux_loss));
        out.extend(
            moe.load_max_over_mean
                .iter()
                .map(|(layer, &v)| (format!("moe/load_max_over_mean/layer_{layer}"), v)),
        );
    }
    let per_rank = [
        ("loader_wait_frac", &m.per_rank.loader_wait_frac),
        ("compute_s", &m.per_rank.compute_s),
        ("peak_rss_mib", &m.per_rank.peak_rss_mib),
    ];
    for (name, values) in per_rank {
        out.extend(
            values
                .iter()
                .enumerate()
                .map(|(rank, &v)| (format!("{name}/rank{rank}"), v)),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::metrics::PerRank;

    #[test]
    fn a_step_has_its_losses_by_type_and_a_tag_per_rank() {
        let m = StepMetrics {
            step: 3,
            loss: 2.0,
            loss_text: Some(1.5),
            lr: 1e-3,
            per_rank: PerRank {
                loader_wait_frac: vec![0.1, 0.2],
                compute_s: vec![1.0, 1.1],
                peak_rss_mib: vec![500.0, 510.0],
            },
            ..StepMetrics::default()
        };
        let tags: std::collections::BTreeMap<String, f64> = scalars(&m).into_iter().collect();
        assert_eq!(tags["loss/all"], 2.0);
        assert_eq!(tags["loss/text_only"], 1.5);
        assert!(!tags.contains_key("loss/image") && !tags.contains_key("loss/validation"));
        assert_eq!(tags["optimizer/lr"], 1e-3);
        assert_eq!(tags["loader_wait_frac/rank1"], 0.2);
        assert_eq!(tags["peak_rss_mib/rank0"], 500.0);
        assert_eq!(tags["compute_s/rank1"], 1.1);
        assert_eq!(tags.len(), 1 + 1 + 7 + 6);
    }
}
