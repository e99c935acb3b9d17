//! Micro-batches to ranks within one micro-step. A rank's micro-batch is padded to its
//! longest row, so it holds `rows * row_len <= budget` tokens.
//! - `pack`: rows, longest first, each to the cheapest rank (by the cost model) that still has
//!   room (longest-processing-time with a capacity), so the slowest rank is close to the mean.
//! - `bucket`: one sample per row; consecutive samples of the length-sorted window fill one
//!   rank after the other (a length bucket per rank), no balancing beyond that.

/// Row indices per rank for `pack`; rows sorted by `(len desc, index)`. `None` if a row fits
/// no rank. With at least `w` rows every rank gets one (empty ranks cost 0, so they go first).
pub(crate) fn assign_rows(
    row_lens: &[u32],
    row_costs: &[f64],
    w: usize,
    budget: u64,
) -> Option<Vec<Vec<u32>>> {
    let mut order: Vec<u32> = (0..row_lens.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| {
        row_lens[b as usize]
            .cmp(&row_lens[a as usize])
            .then(a.cmp(&b))
    });
    let mut ranks: Vec<Vec<u32>> = vec![Vec::new(); w];
    let mut cost = vec![0.0f64; w];
    let mut row_len = vec![0u64; w];
    for &row in &order {
        let len = u64::from(row_lens[row as usize]);
        let mut best: Option<usize> = None;
        for r in 0..w {
            let width = row_len[r].max(len);
            if (ranks[r].len() as u64 + 1) * width > budget {
                continue;
            }
            if best.is_none_or(|b| cost[r] < cost[b]) {
                best = Some(r);
            }
        }
        let r = best?;
        ranks[r].push(row);
        cost[r] += row_costs[row as usize];
        row_len[r] = row_len[r].max(len);
    }
    Some(ranks)
}

/// A swap `balance_costs` considers: the pair's higher cost after it, the other rank, and the
/// (row, position) of each sample.
struct Swap {
    cost: f64,
    rank: usize,
    hi_at: (usize, usize),
    at: (usize, usize),
}

/// Evens the ranks' costs after `assign_rows`: swaps a sample of the costliest rank for a
/// cheaper one of another rank (any rows), choosing the swap that leaves the pair's costlier
/// rank cheapest, while that lowers the costliest rank. A swap never makes a row longer than
/// its rank's longest (or, in a rank of one row, which has no padding, longer than `cap`), so
/// the padding in all does not grow (what one rank's rows lose in real tokens the other's
/// gain). Levelled rows are close in
/// length but not in cost (an AnyRes image's tiles cost the vision tower as much as its tokens
/// cost the LM), which is what this corrects. `ranks`: rows of sample indices per rank.
pub(crate) fn balance_costs(ranks: &mut [Vec<Vec<u32>>], lens: &[u32], costs: &[f64], cap: u32) {
    let row_len = |row: &[u32]| row.iter().map(|&s| lens[s as usize]).sum::<u32>();
    let rank_cost =
        |rows: &[Vec<u32>]| -> f64 { rows.iter().flatten().map(|&s| costs[s as usize]).sum() };
    for _ in 0..4 * ranks.len() {
        let totals: Vec<f64> = ranks.iter().map(|r| rank_cost(r)).collect();
        let Some(hi) = (0..ranks.len()).max_by(|&a, &b| totals[a].total_cmp(&totals[b])) else {
            return;
        };
        // How long a row of the rank may get: its longest row, or the cap for a rank of one row.
        let width = |rows: &[Vec<u32>]| match rows.len() {
            1 => cap,
            _ => rows.iter().map(|r| row_len(r)).max().unwrap_or(0),
        };
        let hi_width = width(&ranks[hi]);
        let mut best: Option<Swap> = None;
        for (r, rows) in ranks.iter().enumerate().filter(|&(r, _)| r != hi) {
            let r_width = width(rows);
            for (i, hi_row) in ranks[hi].iter().enumerate() {
                let hi_len = row_len(hi_row);
                for (a, &sa) in hi_row.iter().enumerate() {
                    let (la, ca) = (lens[sa as usize], costs[sa as usize]);
                    for (j, row) in rows.iter().enumerate() {
                        let len = row_len(row);
                        for (b, &sb) in row.iter().enumerate() {
                            let (lb, cb) = (lens[sb as usize], costs[sb as usize]);
                            let fits = hi_len - la + lb <= hi_width && len - lb + la <= r_width;
                            if cb >= ca || !fits {
                                continue;
                            }
                            let pair = (totals[hi] - ca + cb).max(totals[r] - cb + ca);
                            if pair < totals[hi] && best.as_ref().is_none_or(|k| pair < k.cost) {
                                best = Some(Swap {
                                    cost: pair,
                                    rank: r,
                                    hi_at: (i, a),
                                    at: (j, b),
                                });
                            }
                        }
                    }
                }
            }
        }
        let Some(Swap {
            rank: r,
            hi_at: (i, a),
            at: (j, b),
            ..
        }) = best
        else {
            return;
        };
        let taken = ranks[hi][i][a];
        ranks[hi][i][a] = ranks[r][j][b];
        ranks[r][j][b] = taken;
    }
}

/// Item indices per rank for `bucket`: `sorted` (longest first) cut into at most `w`
/// consecutive groups, each `count * first_len <= budget`, leaving an item for every later rank
/// while items last. `None` if the items do not fit `w` ranks.
pub(crate) fn assign_buckets(
    lens: &[u32],
    sorted: &[u32],
    w: usize,
    budget: u64,
) -> Option<Vec<Vec<u32>>> {
    let n = sorted.len();
    let mut ranks: Vec<Vec<u32>> = vec![Vec::new(); w];
    let mut i = 0;
    for (r, group) in ranks.iter_mut().enumerate() {
        let Some(&first) = sorted.get(i) else { break };
        let width = u64::from(lens[first as usize]);
        let keep_for_later = w - r - 1;
        while i < n
            && (group.is_empty() || n - i > keep_for_later)
            && (group.len() as u64 + 1) * width <= budget
        {
            group.push(sorted[i]);
            i += 1;
        }
    }
    (i == n).then_some(ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lpt_balances_costs_and_respects_the_budget() {
        let lens = [100, 100, 90, 90, 80, 80];
        let costs: Vec<f64> = lens.iter().map(|&l| f64::from(l)).collect();
        let ranks = assign_rows(&lens, &costs, 2, 300).expect("fits");
        let sums: Vec<f64> = ranks
            .iter()
            .map(|r| r.iter().map(|&i| costs[i as usize]).sum())
            .collect();
        assert_eq!(sums, vec![270.0, 270.0]);
    }

    #[test]
    fn buckets_leave_one_item_for_every_rank() {
        let lens = [5, 5, 5, 5];
        let ranks = assign_buckets(&lens, &[0, 1, 2, 3], 3, 1000).expect("fits");
        assert!(ranks.iter().all(|r| !r.is_empty()), "{ranks:?}");
    }
}
