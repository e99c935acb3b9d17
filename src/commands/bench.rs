//! `tessera bench loader|plan|generate`.
#[cfg(feature = "train")]
use super::bench_generate;
use super::{bench_loader, bench_plan};

/// Arguments of `tessera bench`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    which: Which,
}

#[derive(clap::Subcommand)]
enum Which {
    /// Loader throughput (images/s) next to decode-only and the PIL reference, same images.
    Loader(bench_loader::Args),
    /// Planner quality (pad, imbalance, type alignment) for pack, bucket and fixed.
    Plan(bench_plan::Args),
    /// Generation tokens/s with the KV cache next to recomputing the prefix, same model.
    #[cfg(feature = "train")]
    Generate(bench_generate::Args),
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    match args.which {
        Which::Loader(a) => bench_loader::run(a),
        Which::Plan(a) => bench_plan::run(a),
        #[cfg(feature = "train")]
        Which::Generate(a) => bench_generate::run(a),
    }
}
