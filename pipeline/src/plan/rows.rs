//! Rows of one look-ahead window: first-fit decreasing decides how many rows the window's
//! samples need; the samples are then dealt into that many rows largest-first, each to the
//! shortest row (levelling), so the rows of a micro-batch are nearly equally long and padding
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
    Some(out)
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
    fn min_rows_spreads_items_over_more_rows() {
        let lens = [10, 10, 10, 10];
        let sorted = [0, 1, 2, 3];
        let rows = pack_rows(&lens, &sorted, 100, 4).expect("fits");
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().all(|r| r.items.len() == 1));
    }
}
