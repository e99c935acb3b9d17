//! Bicubic filter taps for one axis, in fixed point, as PIL computes them.
//!
//! PIL's `ImagingResample` (and `fast_image_resize`, which matches it): the Catmull-Rom kernel
//! (a = -0.5), widened by the scale when shrinking, each output's window clipped to the image
//! and its weights normalised to sum to one. Here every output gets the same number of taps
//! (the widest window's); the extra ones of narrower windows weigh zero.

/// Fixed-point weights: 1.0 is `1 << WEIGHT_BITS`. 14 bits keep every weight an `i16`.
pub(super) const WEIGHT_BITS: u32 = 14;
const ONE: i32 = 1 << WEIGHT_BITS;

/// The taps of every output position along one axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Taps {
    /// Taps per output.
    len: usize,
    /// Input index of each tap, `len` per output, all `< input`.
    index: Vec<u32>,
    /// Weight of each tap, `len` per output, summing to exactly `1 << WEIGHT_BITS`.
    weights: Vec<i16>,
}

/// Catmull-Rom, PIL's `BICUBIC` (a = -0.5).
fn catmull_rom(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        (1.5 * x - 2.5) * x * x + 1.0
    } else if x < 2.0 {
        ((-0.5 * x + 2.5) * x - 4.0) * x + 2.0
    } else {
        0.0
    }
}

/// `x.round() as i32` (half away from zero) without libm's `round`, a call per weight on
/// baseline x86_64 that made building taps cost ~40 µs.
fn round(x: f64) -> i32 {
    if x >= 0.0 {
        (x + 0.5) as i32
    } else {
        (x - 0.5) as i32
    }
}

impl Taps {
    /// Taps that resample `input` positions to `output` (both at least 1).
    pub(super) fn new(input: usize, output: usize) -> Taps {
        let (input, output) = (input.max(1), output.max(1));
        let scale = input as f64 / output as f64;
        let filter_scale = scale.max(1.0);
        let support = 2.0 * filter_scale;
        let inverse_scale = 1.0 / filter_scale;
        // Input window [first, end) of output i, never empty.
        let window = |i: usize| {
            let center = (i as f64 + 0.5) * scale;
            // `as usize` truncates, which is PIL's floor for the non-negative values here
            // (and 0 for negative ones), without a libm call per output.
            let first = (center - support + 0.5).max(0.0) as usize;
            let end = ((center + support + 0.5) as usize).min(input);
            (center, first.min(input - 1), end.max(first + 1).min(input))
        };
        let len = (0..output)
            .map(window)
            .map(|(_, first, end)| end - first)
            .max()
            .unwrap_or(1);
        let mut index = Vec::with_capacity(output * len);
        let mut weights = Vec::with_capacity(output * len);
        let mut raw = vec![0f64; len];
        let mut fixed = vec![0i32; len];
        for i in 0..output {
            let (center, first, end) = window(i);
            let taps = end - first;
            for (t, w) in raw[..taps].iter_mut().enumerate() {
                *w = catmull_rom(((first + t) as f64 - center + 0.5) * inverse_scale);
            }
            let sum: f64 = raw[..taps].iter().sum();
            let to_fixed = if sum == 0.0 { 1.0 } else { 1.0 / sum } * ONE as f64;
            for (f, w) in fixed[..taps].iter_mut().zip(&raw) {
                *f = round(w * to_fixed);
            }
            // Rounding can leave the sum off by a unit or two: the largest weight takes the
            // difference, so a flat colour comes out exactly.
            let error = ONE - fixed[..taps].iter().sum::<i32>();
            if let Some(top) = (0..taps).max_by_key(|&k| fixed[k]) {
                fixed[top] += error;
            }
            for (t, &weight) in fixed.iter().enumerate() {
                // Padding taps point at the window's last input and weigh nothing.
                index.push((first + t).min(end - 1) as u32);
                weights.push(if t < taps { weight as i16 } else { 0 });
            }
        }
        Taps {
            len,
            index,
            weights,
        }
    }

    /// How many output positions these taps make.
    pub(super) fn output(&self) -> usize {
        self.index.len() / self.len
    }

    /// Taps per output.
    pub(super) fn per_output(&self) -> usize {
        self.len
    }

    /// The largest input index any tap reads.
    pub(super) fn max_index(&self) -> usize {
        self.index.iter().copied().max().unwrap_or(0) as usize
    }

    /// Input indices and weights of output `i`.
    pub(super) fn of(&self, i: usize) -> (&[u32], &[i16]) {
        let span = i * self.len..(i + 1) * self.len;
        (&self.index[span.clone()], &self.weights[span])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_output_sums_to_one_and_reads_inside_the_input() {
        for (input, output) in [
            (448, 384),
            (336, 384),
            (1000, 384),
            (1, 384),
            (384, 1),
            (5, 3),
        ] {
            let taps = Taps::new(input, output);
            assert_eq!(taps.output(), output);
            for i in 0..output {
                let (index, weights) = taps.of(i);
                assert!(
                    index.iter().all(|&j| (j as usize) < input),
                    "{input}->{output}"
                );
                let sum: i32 = weights.iter().map(|&w| w as i32).sum();
                assert_eq!(sum, ONE, "{input}->{output} output {i}");
            }
        }
    }

    #[test]
    fn same_size_is_the_identity_and_upscales_take_four_taps() {
        let same = Taps::new(7, 7);
        for i in 0..7 {
            let (index, weights) = same.of(i);
            let hit: Vec<_> = index.iter().zip(weights).filter(|(_, &w)| w != 0).collect();
            assert_eq!(hit, vec![(&(i as u32), &(ONE as i16))]);
        }
        assert_eq!(Taps::new(336, 384).per_output(), 4);
        assert_eq!(Taps::new(448, 384).per_output(), 5);
        assert!(Taps::new(1000, 384).per_output() >= 10);
    }
}
