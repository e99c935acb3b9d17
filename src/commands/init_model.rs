//! `tessera init-model`: filled in by its issue.

/// Arguments of `tessera init-model`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera init-model` is not built yet")
}
