//! The training loop, config, schedule, metrics, checkpoints, export (train issue).
