//! Flat parameter buffers. Each unit's parameters flatten, in the unit's `params()` order, into
//! two 1-D buffers (frozen and trainable, so frozen weights never carry gradients or optimizer
//! state), each padded to a multiple of the world size W. Rank r keeps elements
//! [r*n/W, (r+1)*n/W) of each buffer: its shard. A parameter read by two units (tied
//! embeddings) lives once, in the first unit that lists it; later units borrow that buffer.
//! Shards fill from a [`ParamSource`] slice by slice: a rank reads only the elements it keeps.
use super::FsdpError;
use crate::unit::{ParamMap, ParamSource, ParamSpec, Unit};
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// Where one parameter sits in its flat buffer.
#[derive(Clone, Debug)]
pub(crate) struct FlatEntry {
    pub(crate) name: String,
    pub(crate) shape: Vec<i64>,
    pub(crate) offset: i64,
    pub(crate) numel: i64,
}

/// One flat buffer: layout plus this rank's shard of it.
pub(crate) struct FlatBuffer {
    pub(crate) unit_name: String,
    pub(crate) trainable: bool,
    /// The expert whose parameters the buffer holds (expert parallelism; see
    /// [`ParamSpec::expert`]): sharded over the expert-replica group, not the whole group.
    pub(crate) expert: Option<usize>,
    pub(crate) entries: Vec<FlatEntry>,
    /// Elements before padding.
    pub(crate) numel: i64,
    /// Elements after padding to a multiple of W.
    pub(crate) padded: i64,
    /// Elements this rank keeps (`padded / W`, or `padded` without sharding).
    pub(crate) shard_len: i64,
    /// First element of this rank's shard within the padded buffer.
    pub(crate) shard_start: i64,
    /// This rank's elements: the f32 master of a trainable buffer, or a frozen buffer in the
    /// compute dtype (frozen weights need no master: under bf16 they are stored in bf16).
    pub(crate) shard: Tensor,
    /// Dtype of the gathered (full) buffer the units compute with.
    pub(crate) compute_kind: Kind,
}

impl FlatBuffer {
    /// "vision.layers.3.frozen", "layers.3.trainable": the buffer's name in logs and checkpoints.
    pub(crate) fn key(&self) -> String {
        let class = if self.trainable {
            "trainable"
        } else {
            "frozen"
        };
        match self.expert {
            Some(e) => format!("{}.expert.{e}.{class}", self.unit_name),
            None => format!("{}.{class}", self.unit_name),
        }
    }

    /// The shard in the compute dtype: itself when it is stored so, else a converted copy
    /// (a trainable f32 master gathered for bf16 compute).
    pub(crate) fn compute_shard(&self) -> Tensor {
        if self.shard.kind() == self.compute_kind {
            self.shard.shallow_clone()
        } else {
            self.shard.to_kind(self.compute_kind)
        }
    }

    /// Views of a full (gathered) buffer as the named parameter tensors.
    ///
    /// One `split_with_sizes` cuts the buffer into the parameters (laid out back to back from
    /// offset 0, as [`build_buffer`] places them) and the padding, so backward builds the
    /// buffer's gradient in one concatenation. A `narrow` per parameter made autograd
    /// zero-fill and add a whole buffer-sized gradient for every parameter: 24 passes over a
    /// 60 MB Qwen2.5-0.5B layer in each backward, and a zero-filled copy of the 545 MB
    /// embedding (docs/performance-notes.md, "Where the full-parameter step goes"). A buffer that is one
    /// parameter and no padding is a plain `view`: no concatenation at all.
    pub(crate) fn views(&self, full: &Tensor) -> Vec<(String, Tensor)> {
        let padding = full.size()[0] - self.numel;
        if let ([e], 0) = (self.entries.as_slice(), padding) {
            return vec![(e.name.clone(), full.view(e.shape.as_slice()))];
        }
        let mut sizes: Vec<i64> = self.entries.iter().map(|e| e.numel).collect();
        if padding > 0 {
            sizes.push(padding);
        }
        let pieces = full.split_with_sizes(sizes.as_slice(), 0);
        self.entries
            .iter()
            .zip(pieces)
            .map(|(e, piece)| (e.name.clone(), piece.view(e.shape.as_slice())))
            .collect()
    }
}

/// All buffers of a unit chain and which buffers each unit reads.
pub(crate) struct FlatParams {
    pub(crate) buffers: Vec<FlatBuffer>,
    /// For unit i, the buffers its forward needs (its own and borrowed ones).
    pub(crate) unit_buffers: Vec<Vec<usize>>,
}

/// Options that fix the buffers' layout on this rank.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShardSpec {
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    /// This rank's place in the expert-replica group (rank, size) that expert buffers are
    /// sharded over; (0, 1) without expert parallelism.
    pub(crate) expert_rank: usize,
    pub(crate) expert_world_size: usize,
    /// False for NO_SHARD: every rank keeps whole buffers.
    pub(crate) sharded: bool,
    /// Dtype of trainable shards (the masters the optimizer updates).
    pub(crate) kind: Kind,
    /// Dtype of gathered buffers and of the compute; frozen shards are stored in it.
    pub(crate) compute_kind: Kind,
    pub(crate) device: Device,
}

impl FlatParams {
    /// Lays out every unit's parameters and fills this rank's shards from `init`, which is asked
    /// only for the slices of each parameter that fall in this rank's shards.
    pub(crate) fn new<C>(
        units: &[Box<dyn Unit<C>>],
        init: &dyn ParamSource,
        spec: ShardSpec,
    ) -> Result<Self, FsdpError> {
        let mut owner_of: HashMap<String, (usize, ParamSpec)> = HashMap::new();
        let mut buffers = Vec::new();
        let mut buffer_of: HashMap<String, usize> = HashMap::new();
        let mut unit_buffers = Vec::with_capacity(units.len());
        for (index, unit) in units.iter().enumerate() {
            let mut needed = Vec::new();
            for trainable in [false, true] {
                let mut own = Vec::new();
                for p in unit.params().iter().filter(|p| p.trainable == trainable) {
                    match owner_of.get(&p.name) {
                        Some((owner, first)) => {
                            if first.shape != p.shape || first.trainable != p.trainable {
                                return Err(FsdpError::Layout {
                                    name: p.name.clone(),
                                    message: format!(
                                        "unit '{}' lists it as {:?} trainable={} but unit '{}' as {:?} trainable={}",
                                        unit.name(),
                                        p.shape,
                                        p.trainable,
                                        units[*owner].name(),
                                        first.shape,
                                        first.trainable
                                    ),
                                });
                            }
                            let b = buffer_of[&p.name];
                            if !needed.contains(&b) {
                                needed.push(b);
                            }
                        }
                        None => {
                            owner_of.insert(p.name.clone(), (index, p.clone()));
                            own.push(p.clone());
                        }
                    }
                }
                // The unit's own parameters (one buffer), then each expert's (one buffer each).
                let mut classes: Vec<(Option<usize>, Vec<ParamSpec>)> = Vec::new();
                for p in own {
                    match classes.iter_mut().find(|(e, _)| *e == p.expert) {
                        Some((_, list)) => list.push(p),
                        None => classes.push((p.expert, vec![p])),
                    }
                }
                classes.sort_by_key(|(e, _)| e.map_or(0, |e| e + 1));
                for (expert, own) in classes {
                    let b = buffers.len();
                    for p in &own {
                        buffer_of.insert(p.name.clone(), b);
                    }
                    let place = BufferPlace {
                        unit_name: unit.name(),
                        trainable,
                        expert,
                    };
                    buffers.push(build_buffer(place, &own, init, spec)?);
                    needed.push(b);
                }
            }
            unit_buffers.push(needed);
        }
        Ok(FlatParams {
            buffers,
            unit_buffers,
        })
    }

    /// The parameters unit `unit` reads, as views of the gathered buffers in `full`.
    pub(crate) fn param_map(&self, unit: usize, full: &HashMap<usize, Tensor>) -> ParamMap {
        let mut map = ParamMap::new();
        for b in &self.unit_buffers[unit] {
            if let Some(t) = full.get(b) {
                map.extend(self.buffers[*b].views(t));
            }
        }
        map
    }
}

/// Which unit a buffer belongs to, and its class.
#[derive(Clone, Copy)]
struct BufferPlace<'a> {
    unit_name: &'a str,
    trainable: bool,
    expert: Option<usize>,
}

fn build_buffer(
    place: BufferPlace<'_>,
    params: &[ParamSpec],
    init: &dyn ParamSource,
    spec: ShardSpec,
) -> Result<FlatBuffer, FsdpError> {
    let BufferPlace {
        unit_name,
        trainable,
        expert,
    } = place;
    let mut entries = Vec::with_capacity(params.len());
    let mut offset = 0i64;
    for p in params {
        let numel: i64 = p.shape.iter().product();
        entries.push(FlatEntry {
            name: p.name.clone(),
            shape: p.shape.clone(),
            offset,
            numel,
        });
        offset += numel;
    }
    let (rank, w) = match expert {
        Some(_) => (spec.expert_rank as i64, spec.expert_world_size as i64),
        None => (spec.rank as i64, spec.world_size as i64),
    };
    let (padded, shard_len, shard_start) = if spec.sharded {
        let padded = (offset + w - 1) / w * w;
        (padded, padded / w, rank * (padded / w))
    } else {
        (offset, offset, 0)
    };
    let kind = if trainable {
        spec.kind
    } else {
        spec.compute_kind
    };
    let shard = Tensor::zeros([shard_len], (kind, spec.device));
    let (lo, hi) = (shard_start, shard_start + shard_len);
    for e in &entries {
        let (a, b) = (e.offset.max(lo), (e.offset + e.numel).min(hi));
        if a >= b {
            continue;
        }
        init.read_into(
            &e.name,
            &e.shape,
            a - e.offset,
            &shard.narrow(0, a - lo, b - a),
        )
        .map_err(|source| FsdpError::Init {
            name: e.name.clone(),
            unit: unit_name.to_string(),
            source: Box::new(source),
        })?;
    }
    Ok(FlatBuffer {
        unit_name: unit_name.to_string(),
        trainable,
        expert,
        entries,
        numel: offset,
        padded,
        shard_len,
        shard_start,
        shard,
        compute_kind: spec.compute_kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trainable buffer of `shapes` back to back (as `build_buffer` lays them out), padded
    /// to `padded` elements.
    fn buffer(shapes: &[(&str, Vec<i64>)], padded: i64) -> FlatBuffer {
        let mut offset = 0;
        let entries: Vec<FlatEntry> = shapes
            .iter()
            .map(|(name, shape)| {
                let numel = shape.iter().product();
                offset += numel;
                FlatEntry {
                    name: name.to_string(),
                    shape: shape.clone(),
                    offset: offset - numel,
                    numel,
                }
            })
            .collect();
        FlatBuffer {
            unit_name: "unit".into(),
            trainable: true,
            expert: None,
            entries,
            numel: offset,
            padded,
            shard_len: padded,
            shard_start: 0,
            shard: Tensor::zeros([padded], (Kind::Float, Device::Cpu)),
            compute_kind: Kind::Float,
        }
    }

    /// Each view holds its own elements, and backward through the views puts each parameter's
    /// gradient at its offset, zero in the padding.
    #[test]
    fn views_read_and_back_propagate_each_parameter_in_place() -> Result<(), tch::TchError> {
        // "a" at [0, 6), "b" at [6, 12), padding at [12, 16).
        let buf = buffer(&[("a", vec![3, 2]), ("b", vec![2, 3])], 16);
        let full = Tensor::arange(16, (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let views = buf.views(&full);
        assert_eq!(views[1].0, "b");
        assert_eq!(
            Vec::<f32>::try_from(&views[1].1.reshape([-1]))?,
            [6., 7., 8., 9., 10., 11.]
        );
        assert_eq!(views[0].1.size(), [3, 2]);
        let loss = (&views[1].1 * 2.0).sum(Kind::Float) + (&views[0].1 * 3.0).sum(Kind::Float);
        let grad = Tensor::run_backward(&[loss], &[&full], false, false).remove(0);
        let want = [
            3., 3., 3., 3., 3., 3., 2., 2., 2., 2., 2., 2., 0., 0., 0., 0.,
        ];
        assert_eq!(Vec::<f32>::try_from(&grad)?, want);
        Ok(())
    }

    /// One parameter: a plain view without padding, a split with it; both back-propagate.
    #[test]
    fn a_buffer_of_one_parameter_is_viewed_whole() -> Result<(), tch::TchError> {
        for (padded, want) in [
            (8, vec![1.0; 8]),
            (10, [vec![1.0; 8], vec![0.0; 2]].concat()),
        ] {
            let buf = buffer(&[("w", vec![4, 2])], padded);
            let full = Tensor::arange(padded, (Kind::Float, Device::Cpu)).set_requires_grad(true);
            let views = buf.views(&full);
            assert_eq!(views[0].1.size(), [4, 2]);
            let loss = views[0].1.sum(Kind::Float);
            let grad = Tensor::run_backward(&[loss], &[&full], false, false);
            assert_eq!(Vec::<f32>::try_from(&grad[0])?, want);
        }
        Ok(())
    }
}
