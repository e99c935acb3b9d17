//! `tessera train`: filled in by its issue.

/// Arguments of `tessera train`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera train` is not built yet")
}
