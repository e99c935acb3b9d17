//! `tessera bench loader`: filled in by the pipeline issue.

/// Arguments of `tessera bench loader`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera bench loader` is not built yet")
}
