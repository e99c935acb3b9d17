//! `tessera bench plan`: filled in by the pipeline issue.

/// Arguments of `tessera bench plan`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera bench plan` is not built yet")
}
