//! `tessera train`: a TOML config (`--config FILE`) overlaid by these flags, validated before any
//! work. With `--nproc N` (N > 1) and no RANK in the environment it launches N local ranks of
//! itself; with RANK set (torchrun or the launcher) it runs one rank.
use anyhow::Context;
use std::path::PathBuf;
use tessera_train::ConfigLayer;

/// Arguments of `tessera train`: the training knobs (each flag overrides the same key of
/// `--config`; they are listed once, in `tessera_train::config`) and how to start this run.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// TOML file with any of the keys below (snake_case, e.g. `token_budget = 8192`).
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    knobs: ConfigLayer,
    /// Continue from the newest complete checkpoint in --out (its run record must match).
    #[arg(long)]
    resume: bool,
    /// With --resume: run-record keys allowed to differ from the checkpoint's (e.g. lr,seed).
    #[arg(long, value_delimiter = ',')]
    resume_changing: Vec<String>,
    /// Clear a non-empty --out (a previous run's folder) and start afresh.
    #[arg(long)]
    overwrite: bool,
}

/// `progress`: one overwritten progress line per step (a terminal, and no `--quiet` or
/// NO_PROGRESS).
pub(crate) fn run(args: Args, progress: bool) -> anyhow::Result<()> {
    let rank_env =
        tessera_fsdp::dist::RankEnv::from_env().context("reading the torchrun environment")?;
    if let Some(env) = &rank_env {
        if tessera_fsdp::dist::started_by_torchrun(|k| std::env::var(k).ok()) {
            // torchrun starts ranks in sessions of their own: one whose agent dies must stop.
            tessera_fsdp::dist::stop_with_torchrun_agent()
                .with_context(|| format!("rank {}", env.rank))?;
        }
    }
    let file = match &args.config {
        Some(path) => ConfigLayer::from_file(path)?,
        None => ConfigLayer::default(),
    };
    let cfg = file.overlay(args.knobs).resolve()?;
    cfg.check_paths()?;
    let start = tessera_train::RunStart {
        resume: args.resume,
        overwrite: args.overwrite,
        resume_changing: args.resume_changing,
        progress,
    };
    if rank_env.is_none() && cfg.nproc > 1 {
        // Checked once here, so a refusal is one message rather than one per rank.
        tessera_train::check_model_dirs(&cfg)?;
        tessera_train::prepare_run_dir(&cfg.out, &start)?;
        return launch_ranks(cfg.nproc);
    }
    let summary = tessera_train::train(&cfg, rank_env, &start)?;
    if let Some(s) = summary {
        println!(
            "trained {} steps: loss {:.4} -> {:.4} (mean of the last 10%: {:.4}); run in {}",
            s.steps,
            s.first_loss,
            s.last_loss,
            s.final_loss_mean,
            cfg.out.display()
        );
        if let (Some(last), Some(best), Some(at)) =
            (s.final_val_loss, s.best_val_loss, s.best_val_step)
        {
            println!("validation loss {last:.4} after the last step (best {best:.4} at step {at})");
        }
    }
    Ok(())
}

/// Re-runs this very command line once per rank through the dist launcher (the ranks see RANK
/// in their environment, so they train instead of launching again).
fn launch_ranks(nproc: usize) -> anyhow::Result<()> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let spec = tessera_fsdp::dist::LaunchSpec::current_exe(nproc, args)
        .context("locating the tessera binary")?;
    tessera_fsdp::dist::launch(spec).context("training on local ranks")?;
    Ok(())
}
