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
