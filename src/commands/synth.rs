//! `tessera synth`: filled in by its issue.

/// Arguments of `tessera synth`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera synth` is not built yet")
}
