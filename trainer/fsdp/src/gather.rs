//! Gathering flat buffers: issue an all-gather (async, so the next unit's gather overlaps the
//! current unit's compute), wait for it, and free gathered buffers no longer needed. Buffers
//! are gathered in the compute dtype (a bf16 run casts its f32 master shards before sending).
use super::flat_param::{FlatBuffer, FlatParams};
use super::FsdpError;
use crate::dist::{ProcessGroup, Work};
use std::collections::HashMap;
use tch::Tensor;

/// The groups a rank's buffers are sharded over: the unit group, and under expert parallelism
/// the expert-replica group (the ranks holding the same experts) for expert buffers.
#[derive(Clone, Copy)]
pub(super) struct BufferGroups<'a> {
    pub(super) dense: &'a ProcessGroup,
    pub(super) experts: Option<&'a ProcessGroup>,
    /// False for NO_SHARD: every buffer whole on every rank of its group.
    pub(super) shard: bool,
}

impl<'a> BufferGroups<'a> {
    /// The group `buf` is sharded (or, unsharded, reduced) over, and whether it is split.
    pub(super) fn of(&self, buf: &FlatBuffer) -> (&'a ProcessGroup, bool) {
        let pg = match (buf.expert, self.experts) {
            (Some(_), Some(experts)) => experts,
            _ => self.dense,
        };
        (pg, self.shard && pg.world_size() > 1)
    }
}

/// Gathered (full) buffers and in-flight gathers of one rank.
#[derive(Default)]
pub(super) struct Gathered {
    pub full: HashMap<usize, Tensor>,
    pending: HashMap<usize, (Tensor, Work)>,
    pub bytes: u64,
    pub peak_bytes: u64,
}

impl Gathered {
    /// Starts gathering every buffer unit `unit` reads that is neither gathered nor in flight.
    /// Without sharding the shard is the whole buffer and nothing is sent.
    pub(super) fn issue(
        &mut self,
        flat: &FlatParams,
        unit: usize,
        unit_name: &str,
        groups: BufferGroups<'_>,
    ) -> Result<(), FsdpError> {
        for &b in &flat.unit_buffers[unit] {
            if self.full.contains_key(&b) || self.pending.contains_key(&b) {
                continue;
            }
            let buf = &flat.buffers[b];
            let shard = buf.compute_shard();
            let (pg, sharded) = groups.of(buf);
            if !sharded {
                self.full.insert(b, shard);
                continue;
            }
            let mut out = Tensor::empty([buf.padded], (shard.kind(), shard.device()));
            let work = pg.all_gather_into(&mut out, &shard, unit_name)?;
            self.bytes += super::optim::tensor_bytes(&out);
            self.peak_bytes = self.peak_bytes.max(self.bytes);
            self.pending.insert(b, (out, work));
        }
        Ok(())
    }

    /// Issues (if needed) and waits for unit `unit`'s buffers.
    pub(super) fn ready(
        &mut self,
        flat: &FlatParams,
        unit: usize,
        unit_name: &str,
        groups: BufferGroups<'_>,
    ) -> Result<(), FsdpError> {
        self.issue(flat, unit, unit_name, groups)?;
        for &b in &flat.unit_buffers[unit] {
            if let Some((out, work)) = self.pending.remove(&b) {
                work.wait()?;
                self.full.insert(b, out);
            }
        }
        Ok(())
    }

    /// Frees unit `unit`'s gathered buffers except those in `keep`.
    pub(super) fn release(
        &mut self,
        flat: &FlatParams,
        unit: usize,
        keep: &[usize],
        groups: BufferGroups<'_>,
    ) {
        for b in &flat.unit_buffers[unit] {
            if keep.contains(b) {
                continue;
            }
            if let Some(t) = self.full.remove(b) {
                if groups.of(&flat.buffers[*b]).1 {
                    self.bytes = self.bytes.saturating_sub(super::optim::tensor_bytes(&t));
                }
            }
        }
    }
}
