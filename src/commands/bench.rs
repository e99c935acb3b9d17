//! `tessera bench`: filled in by its issue.

/// Arguments of `tessera bench`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera bench` is not built yet")
}
