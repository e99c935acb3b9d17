//! Rows of one look-ahead window: first-fit decreasing decides how many rows the window's
//! samples need; the samples are then dealt into that many rows largest-first, each to the
//! shortest row (levelling), and evened out by moving or swapping items between the longest
//! and the shortest row, so the rows of a micro-batch are nearly equally long and padding
//! every row to the longest wastes little. If levelling would overflow a row, FFD's rows stay.
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One packed row: window-local item indices (in packing order) and its token count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub items: Vec<u32>,
    pub len: u32,
}

/// Packs `sorted` (window-local indices, longest first) into rows of at most `cap` tokens,
/// at least `min_rows` of them (never more rows than items). `None` if no layout fits, which
/// cannot happen when every item fits `cap` and `min_rows <= items`.
pub(crate) fn pack_rows(
    lens: &[u32],
    sorted: &[u32],
    cap: u32,
    min_rows: usize,
) -> Option<Vec<Row>> {
    let (ffd_row_of, ffd_rows) = first_fit_decreasing(lens, sorted, cap);
    let rows = ffd_rows.max(min_rows.min(sorted.len()));
    if let Some(levelled) = level(lens, sorted, cap, rows) {
        return Some(levelled);
    }

    if rows != ffd_rows {
        return None;
    }
    let mut out = vec![
        Row {
            items: Vec::new(),
            len: 0
        };
        ffd_rows
    ];
    for (&item, &row) in sorted.iter().zip(&ffd_row_of) {
        out[row].items.push(item);
        out[row].len += lens[item as usize];
    }
    even_out(lens, &mut out);
    Some(out)
}

/// First-fit decreasing with a max segment tree over the rows' free space, so each item
/// finds the leftmost row with room in O(log n). Returns the row of each sorted item and the
/// number of rows used.
fn first_fit_decreasing(lens: &[u32], sorted: &[u32], cap: u32) -> (Vec<usize>, usize) {
    let size = sorted.len().next_power_of_two().max(1);
    let mut free = vec![cap; 2 * size];
    let mut row_of = Vec::with_capacity(sorted.len());
    let mut used = 0;
    for &item in sorted {
        let len = lens[item as usize];
        let mut node = 1;
        while node < size {
            node = if free[2 * node] >= len {
                2 * node
            } else {
                2 * node + 1
            };
        }
        free[node] = free[node].saturating_sub(len);
        let row = node - size;
        node /= 2;
        while node >= 1 {
            free[node] = free[2 * node].max(free[2 * node + 1]);
            node /= 2;
        }
        used = used.max(row + 1);
        row_of.push(row);
    }
    (row_of, used)
}

/// Longest-processing-time dealing of the sorted items into exactly `rows` rows.
fn level(lens: &[u32], sorted: &[u32], cap: u32, rows: usize) -> Option<Vec<Row>> {
    let mut heap: BinaryHeap<Reverse<(u32, usize)>> = (0..rows).map(|r| Reverse((0, r))).collect();
    let mut out = vec![
        Row {
            items: Vec::new(),
            len: 0
        };
        rows
    ];
    for &item in sorted {
        let len = lens[item as usize];
        let Reverse((load, row)) = heap.pop()?;
        if load + len > cap {
            return None;
        }
        out[row].items.push(item);
        out[row].len = load + len;
        heap.push(Reverse((load + len, row)));
    }
    even_out(lens, &mut out);
    Some(out)
}

/// An exchange `even_out` considers: the pair's rows after it (longer, shorter), the other
/// row, the longest row's item that goes, and the other row's item that comes back (if any).
struct Exchange {
    longer: u32,
    shorter: u32,
    row: usize,
    item: usize,
    back: Option<usize>,
}

/// Lowers the longest row while it can: moves one of its items to another row, or swaps one
/// of its items for a shorter one of another row, choosing the exchange that leaves the pair's
/// longer row shortest; the other row never reaches the old longest, so the cap holds and no
/// row grows past it. Dealing alone (or FFD, when dealing would overflow a row) leaves rows of
/// few-thousand-token items (AnyRes images) hundreds of tokens apart; this brings them to
/// within tens.
fn even_out(lens: &[u32], rows: &mut [Row]) {
    for _ in 0..8 * rows.len() {
        let Some(long) = (0..rows.len()).max_by_key(|&r| (rows[r].len, Reverse(r))) else {
            return;
        };
        let top = rows[long].len;
        let mut best: Option<Exchange> = None;
        for (r, row) in rows.iter().enumerate().filter(|&(r, _)| r != long) {
            for (a, &ia) in rows[long].items.iter().enumerate() {
                let la = lens[ia as usize];
                let mut consider = |shift: u32, b: Option<usize>| {
                    if shift == 0 || row.len + shift >= top {
                        return;
                    }
                    let (hi, lo) = (
                        (top - shift).max(row.len + shift),
                        (top - shift).min(row.len + shift),
                    );
                    let better = |k: &Exchange| (hi, Reverse(lo)) < (k.longer, Reverse(k.shorter));
                    if best.as_ref().is_none_or(better) {
                        best = Some(Exchange {
                            longer: hi,
                            shorter: lo,
                            row: r,
                            item: a,
                            back: b,
                        });
                    }
                };
                consider(la, None);
                for (b, &ib) in row.items.iter().enumerate() {
                    consider(la.saturating_sub(lens[ib as usize]), Some(b));
                }
            }
        }
        let Some(Exchange {
            row: r,
            item: a,
            back: b,
            ..
        }) = best
        else {
            return;
        };
        let item = rows[long].items.remove(a);
        let mut shift = lens[item as usize];
        if let Some(b) = b {
            let back = rows[r].items.remove(b);
            shift -= lens[back as usize];
            rows[long].items.push(back);
        }
        rows[r].items.push(item);
        rows[long].len -= shift;
        rows[r].len += shift;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ffd_uses_the_minimum_rows_for_pairs_and_levels_them() {
        // Six items that pair up under cap 100: FFD needs 3 rows; levelling makes them equal.
        let lens = [60, 40, 55, 45, 50, 50];
        let mut sorted: Vec<u32> = (0..6).collect();
        sorted.sort_by_key(|&i| Reverse(lens[i as usize]));
        let rows = pack_rows(&lens, &sorted, 100, 1).expect("fits");
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|r| r.len == 100), "{rows:?}");
    }

    #[test]
    fn evening_out_brings_dealt_rows_together() {
        // Dealt largest-first into 2 rows, 3,050 tokens end up 1,500 + 50s and 1,550 or so
        // apart by whole items; exchanges bring the rows to within the smallest item.
        let lens = [900, 800, 500, 400, 300, 50, 50, 50];
        let sorted: Vec<u32> = (0..lens.len() as u32).collect();
        let rows = pack_rows(&lens, &sorted, 2000, 2).expect("fits");
        let total: u32 = lens.iter().sum();
        assert_eq!(rows.iter().map(|r| r.len).sum::<u32>(), total);
        for r in &rows {
            assert_eq!(
                r.len,
                r.items.iter().map(|&i| lens[i as usize]).sum::<u32>()
            );
        }
        let spread = rows.iter().map(|r| r.len).max().unwrap_or(0)
            - rows.iter().map(|r| r.len).min().unwrap_or(0);
        assert!(spread <= 50, "{rows:?}");
    }

    #[test]
    fn min_rows_spreads_items_over_more_rows() {
        let lens = [10, 10, 10, 10];
        let sorted = [0, 1, 2, 3];
        let rows = pack_rows(&lens, &sorted, 100, 4).expect("fits");
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().all(|r| r.items.len() == 1));
    }
}
