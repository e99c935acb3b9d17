//! `tessera shards`: filled in by its issue.

/// Arguments of `tessera shards`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera shards` is not built yet")
}
