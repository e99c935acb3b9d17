//! `tessera export`: filled in by its issue.

/// Arguments of `tessera export`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera export` is not built yet")
}
