//! A forward-only pass through the chain for evaluation (validation loss): no autograd, no
//! gradients, parameters gathered one unit after the other as in training.
use super::engine::Fsdp;
use super::FsdpError;
use tch::Tensor;

impl<C> Fsdp<'_, C> {
    /// Forward only, no autograd and no gradients (evaluation): every unit that runs on the
    /// micro-batch, gathered one after the other. Returns this rank's summed token loss. All
    /// ranks must call it for micro-batches of the same kind (as for training).
    pub fn forward_loss(&mut self, ctx: &C, input: &Tensor) -> Result<f64, FsdpError> {
        let running = self.running_units(ctx)?;
        let Some(&last) = running.last() else {
            return Ok(0.0);
        };
        let groups = self.groups();
        let mut x = input.shallow_clone();
        for (p, &u) in running.iter().enumerate() {
            let name = self.units[u].name();
            self.gathered.ready(&self.flat, u, name, groups)?;
            let next = running.get(p + 1).copied();
            if let Some(next) = next.filter(|_| self.config.prefetch) {
                let next_name = self.units[next].name();
                self.gathered.issue(&self.flat, next, next_name, groups)?;
            }
            let params = self.flat.param_map(u, &self.gathered.full);
            x = tch::no_grad(|| self.run_unit(u, &params, &x, ctx))?;
            let keep = next.map_or_else(Vec::new, |n| self.flat.unit_buffers[n].clone());
            self.gathered.release(&self.flat, u, &keep, groups);
        }
        Ok(self.chain_loss(last, &x)?.sum)
    }
}
