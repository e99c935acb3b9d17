//! One module per subcommand: its clap `Args` and a `run(args) -> anyhow::Result<()>`.
pub(crate) mod bench;
#[cfg(feature = "train")]
pub(crate) mod bench_generate;
pub(crate) mod bench_loader;
pub(crate) mod bench_plan;
#[cfg(feature = "train")]
pub(crate) mod export;
#[cfg(feature = "train")]
pub(crate) mod generate;
pub(crate) mod ingest;
#[cfg(feature = "train")]
pub(crate) mod init_model;
pub(crate) mod shards;
pub(crate) mod synth;
#[cfg(feature = "train")]
pub(crate) mod train;

/// Logs go to stderr through `tracing`; RUST_LOG overrides the level.
pub(crate) fn init_logging(quiet: bool) {
    let default = if quiet { "warn" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}
