//! Checkpoints: the on-disk format and its commit protocol (`format.rs`), format 4's sharded
//! trainable state (`sharded_state.rs`: each rank's flat shards, re-sliced for any world
//! size), the choice of the checkpoint to resume from (`pick.rs`) and the training loop's
//! saver (`save.rs`: sync or async writes).
pub(crate) mod format;
pub(crate) mod pick;
pub(crate) mod room;
pub(crate) mod save;
pub(crate) mod sharded_state;
pub(crate) mod trained;

#[cfg(test)]
mod tests;
