//! The planner: type-aligned, token-budget packing and rank balancing. Every rank builds the
//! same [`Planner`] from the dataset's metadata and computes the same [`Plan`] alone.
//!
//! 1. `order`: one seeded shuffle of all samples (seed from fingerprint, seed, epoch), split
//!    into a text stream and an image stream. Nothing here depends on the world size.
//! 2. `chunk`: each micro-step takes a prefix of one kind's stream (a look-ahead window
//!    sized to `W * B` tokens), packs it into rows (first-fit decreasing, then levelled,
//!    `rows`) and deals the rows to the W ranks by cost (`assign`); every rank gets the
//!    same kind, every micro-batch holds at most B tokens padding included.
//! 3. `schedule`: micro-steps interleave the kinds in shuffled order and group into steps
//!    of G; each step records its supervised-token total (the loss divisor) and the
//!    [`Position`] before it. A position counts samples consumed per kind, so resuming with a
//!    different W continues from the same samples: none repeated, none skipped.
//!
//! Samples longer than `min(seq_len, token_budget)` are never truncated (a truncated caption
//! or image would train on a wrong target): `build()` rejects them with their index, or with
//! [`OverLong::Skip`] leaves them out of every epoch and lists them ([`Planner::skipped`]).
//!
//! ```
//! use tessera_pipeline::plan::{Mode, Planner, synthetic_llava};
//! let samples = synthetic_llava(2_000, 0.1, 7);
//! let planner = Planner::builder()
//!     .samples(&samples)
//!     .world_size(4)
//!     .token_budget(8192)
//!     .micro_steps(2)
//!     .fingerprint("doc")
//!     .build()?;
//! let plan = planner.plan();
//! assert!(plan.steps.iter().flat_map(|s| &s.micro_steps).all(|m| m.kind().is_some()));
//! assert_eq!(plan.stats.samples, 2_000);
//! // Resume at step 3 with two ranks instead of four: the same samples remain.
//! let two = Planner::builder().samples(&samples).world_size(2).fingerprint("doc").build()?;
//! let rest = two.plan_from(&plan.resume_position(3)?)?;
//! let done: u64 = plan.steps[..3].iter().flat_map(|s| &s.micro_steps).flat_map(|m| &m.ranks)
//!     .filter(|mb| !mb.zero_loss).map(|mb| mb.rows.iter().flatten().count() as u64).sum();
//! assert_eq!(done + rest.stats.samples, 2_000);
//! # assert_eq!(Mode::default(), Mode::Pack);
//! # Ok::<(), tessera_pipeline::plan::PlanError>(())
//! ```
mod assign;
mod chunk;
mod error;
mod order;
mod planner;
mod rows;
mod schedule;
mod stats;
mod synthetic;
mod types;

pub use error::PlanError;
pub use planner::{CostModel, Mode, OverLong, Planner, PlannerBuilder, SkippedSample};
pub use synthetic::synthetic_llava;
pub use types::{MicroStep, Plan, PlanStats, Position, Step};
