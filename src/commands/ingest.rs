//! `tessera ingest`: filled in by its issue.

/// Arguments of `tessera ingest`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera ingest` is not built yet")
}
