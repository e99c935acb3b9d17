//! Gathering flat buffers: issue an all-gather (async, so the next unit's gather overlaps the
//! current unit's compute), wait for it, and free gathered buffers no longer needed. Buffers
//! are gathered in the compute dtype (a bf16 run casts its f32 master shards before sending).
use super::flat_param::FlatParams;
use super::FsdpError;
use crate::dist::{ProcessGroup, Work};
use std::collections::HashMap;
use tch::Tensor;

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
        pg: &ProcessGroup,
        sharded: bool,
    ) -> Result<(), FsdpError> {
        for &b in &flat.unit_buffers[unit] {
            if self.full.contains_key(&b) || self.pending.contains_key(&b) {
                continue;
            }
            let buf = &flat.buffers[b];
            let shard = buf.compute_shard();
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
        pg: &ProcessGroup,
        sharded: bool,
    ) -> Result<(), FsdpError> {
        self.issue(flat, unit, unit_name, pg, sharded)?;
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
        sharded: bool,
    ) {
        for b in &flat.unit_buffers[unit] {
            if keep.contains(b) {
                continue;
            }
            if let Some(t) = self.full.remove(b) {
                if sharded {
                    self.bytes = self.bytes.saturating_sub(super::optim::tensor_bytes(&t));
                }
            }
        }
    }
}
