//! One micro-step: which samples it consumes and how they split over the W ranks.
//!
//! `pack` and `bucket` take a prefix of one kind's stream (the look-ahead window): the
//! longest prefix, found by galloping down from the largest one whose tokens fit `W * B`,
//! that can be laid out on the W ranks within the budget. A micro-step depends only on where
//! the streams stand, so a plan resumed from a position repeats the original exactly.
//! `fixed` takes the next `W * c` samples of the shuffled order, kinds mixed.
use super::assign::{assign_buckets, assign_rows, balance_costs};
use super::planner::{Mode, Planner};
use super::rows::pack_rows;
use tessera_shards::Kind;

/// One rank's micro-batch as sample indices per row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RankBatch {
    pub rows: Vec<Vec<u32>>,
    pub zero_loss: bool,
}

impl Planner {
    /// Lays out the next micro-step of `kind` starting at `start` of its stream; returns the
    /// ranks' micro-batches and how many stream samples it consumed.
    pub(crate) fn kind_micro_step(&self, kind: Kind, start: usize) -> (Vec<RankBatch>, usize) {
        let w = self.world_size;
        let remaining = self.order.stream_len(kind) - start;
        let mut samples = Vec::new();
        let mut lens = Vec::new();
        let mut tokens = 0u64;
        let limit = w as u64 * self.token_budget;
        while samples.len() < remaining {
            let s = self.order.sample(kind, start + samples.len());
            let len = self.lens[s as usize];
            if tokens + u64::from(len) > limit && samples.len() >= w.min(remaining) {
                break;
            }
            tokens += u64::from(len);
            samples.push(s);
            lens.push(len);
        }
        let (n, mut ranks) = self.largest_fitting_prefix(&samples, &lens);
        if self.mode != Mode::Bucket {
            // Once, on the layout chosen (not on every prefix the search tries).
            let mut rows: Vec<Vec<Vec<u32>>> = ranks
                .iter_mut()
                .map(|r| std::mem::take(&mut r.rows))
                .collect();
            balance_costs(&mut rows, &self.lens, &self.costs, self.row_cap);
            for (rank, rows) in ranks.iter_mut().zip(rows) {
                rank.rows = rows;
            }
        }
        // Only a kind's last few samples can leave ranks empty: fill them with zero-loss copies
        // of those samples (images included, so the vision tower runs on every rank).
        for (j, rank) in ranks
            .iter_mut()
            .enumerate()
            .filter(|(_, r)| r.rows.is_empty())
        {
            rank.rows = vec![vec![samples[j % n]]];
            rank.zero_loss = true;
        }
        (ranks, n)
    }

    /// Gallops down from the whole window to a prefix that fits, then bisects back up. A
    /// prefix of `min(W, window)` samples always fits (one sample per rank), so this ends.
    fn largest_fitting_prefix(&self, samples: &[u32], lens: &[u32]) -> (usize, Vec<RankBatch>) {
        let n0 = samples.len();
        let floor = self.world_size.min(n0);
        // Sorted once, longest first; a prefix's order is this order filtered to the prefix.
        let mut by_len: Vec<u32> = (0..n0 as u32).collect();
        by_len.sort_unstable_by(|&a, &b| lens[b as usize].cmp(&lens[a as usize]).then(a.cmp(&b)));
        let layout = |n: usize| self.layout(samples, lens, &by_len, n);
        if let Some(ranks) = layout(n0) {
            return (n0, ranks);
        }
        let (mut bad, mut step) = (n0, 1);
        let (mut good, mut best) = loop {
            let n = n0.saturating_sub(step);
            if n <= floor {
                break (floor, self.one_per_rank(&samples[..floor]));
            }
            if let Some(ranks) = layout(n) {
                break (n, ranks);
            }
            bad = n;
            step *= 2;
        };
        while bad - good > 1 {
            let mid = (good + bad) / 2;
            match layout(mid) {
                Some(ranks) => (good, best) = (mid, ranks),
                None => bad = mid,
            }
        }
        (good, best)
    }

    /// Sample r alone on rank r (ranks past the samples stay empty): fits because every
    /// sample fits a row and a row fits the budget (checked by `build()`).
    fn one_per_rank(&self, samples: &[u32]) -> Vec<RankBatch> {
        (0..self.world_size)
            .map(|r| RankBatch {
                rows: samples.get(r).map(|&s| vec![s]).into_iter().collect(),
                zero_loss: false,
            })
            .collect()
    }

    /// Lays the first `n` window samples out on the ranks (`by_len`: the window's indices,
    /// longest first), or `None` if they do not fit.
    fn layout(
        &self,
        samples: &[u32],
        lens: &[u32],
        by_len: &[u32],
        n: usize,
    ) -> Option<Vec<RankBatch>> {
        let lens = &lens[..n];
        let sorted: Vec<u32> = by_len
            .iter()
            .copied()
            .filter(|&i| (i as usize) < n)
            .collect();
        let to_samples = |items: &[u32]| items.iter().map(|&i| samples[i as usize]).collect();
        let w = self.world_size;
        let per_rank_rows: Vec<Vec<Vec<u32>>> = match self.mode {
            Mode::Bucket => assign_buckets(lens, &sorted, w, self.token_budget)?
                .into_iter()
                .map(|items| items.iter().map(|&i| vec![samples[i as usize]]).collect())
                .collect(),
            Mode::Pack | Mode::Fixed => {
                let rows = pack_rows(lens, &sorted, self.row_cap, w.min(n))?;
                let row_lens: Vec<u32> = rows.iter().map(|r| r.len).collect();
                let row_costs: Vec<f64> = rows
                    .iter()
                    .map(|r| {
                        r.items
                            .iter()
                            .map(|&i| self.costs[samples[i as usize] as usize])
                            .sum()
                    })
                    .collect();
                assign_rows(&row_lens, &row_costs, w, self.token_budget)?
                    .into_iter()
                    .map(|ids| {
                        ids.iter()
                            .map(|&r| to_samples(&rows[r as usize].items))
                            .collect()
                    })
                    .collect()
            }
        };
        Some(
            per_rank_rows
                .into_iter()
                .map(|rows| RankBatch {
                    rows,
                    zero_loss: false,
                })
                .collect(),
        )
    }

    /// `fixed`: the next `W * c` samples of the shuffled order from global position `pos`,
    /// `c` consecutive ones per rank, one sample per row. Returns the ranks and the number of
    /// samples consumed.
    pub(crate) fn fixed_micro_step(&self, pos: usize) -> (Vec<RankBatch>, usize) {
        let c = self.fixed_samples;
        let take = (self.world_size * c).min(self.order.order.len() - pos);
        let chunk = &self.order.order[pos..pos + take];
        let mut ranks: Vec<RankBatch> = chunk
            .chunks(c)
            .map(|s| RankBatch {
                rows: s.iter().map(|&i| vec![i]).collect(),
                zero_loss: false,
            })
            .collect();
        // A short last micro-step: the empty ranks run zero-loss copies of its last sample.
        let last = chunk[take - 1];
        ranks.resize(
            self.world_size,
            RankBatch {
                rows: vec![vec![last]],
                zero_loss: true,
            },
        );
        (ranks, take)
    }
}
