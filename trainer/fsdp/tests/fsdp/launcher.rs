//! The `--nproc` launcher with real processes: this test binary re-invokes itself as the ranks
//! (the `#[ignore]`d `launcher::rank_body` test, selected with `--ignored --exact`), which
//! rendezvous through the torchrun variables the launcher sets.
use std::ffi::OsString;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tch::Tensor;
use tessera_fsdp::dist::{args_without_nproc, launch, LaunchError, LaunchSpec, Stream};
use tessera_fsdp::dist::{init_process_group, Backend, RankEnv};

/// The rank side. `LAUNCHER_TEST_ROLE=ok` (this test's message to the ranks it starts, not a
/// tessera switch): all-reduce and exit 0. `kill`: rank 1 kills itself with
/// SIGKILL after the all-reduce while rank 0 waits in a barrier that would last 300 s.
#[test]
#[ignore = "run by the launcher tests as a rank process"]
fn rank_body() -> anyhow::Result<()> {
    let env = RankEnv::from_env()?.ok_or_else(|| anyhow::anyhow!("WORLD_SIZE is not set"))?;
    let pg = init_process_group(&env, Backend::Gloo, Duration::from_secs(300))?;
    let mut x = Tensor::from_slice(&[env.rank as f32 + 1.0]);
    pg.all_reduce_sum(&mut x, "smoke")?.wait()?;
    // straight to fd 2 (libtest's capture would route eprintln! into the stdout stream)
    use std::io::Write;
    writeln!(
        std::io::stderr().lock(),
        "rank {} of {}: sum {}",
        env.rank,
        env.world_size,
        x.double_value(&[0])
    )?;
    if std::env::var("LAUNCHER_TEST_ROLE").as_deref() == Ok("kill") && env.rank == 1 {
        // SAFETY: kill(2) on our own pid.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    pg.barrier("end")?;
    Ok(())
}

fn spec(role: &str, lines: Arc<Mutex<Vec<(Stream, String)>>>) -> anyhow::Result<LaunchSpec> {
    let args: Vec<OsString> = [
        "--ignored",
        "--exact",
        "launcher::rank_body",
        "--nocapture",
        "--test-threads=1",
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    let mut spec = LaunchSpec::current_exe(2, args)?;
    spec.grace = Duration::from_secs(2);
    spec.env.push(("LAUNCHER_TEST_ROLE".into(), role.into()));
    spec.log = Some(Arc::new(move |stream, line: &str| {
        if let Ok(mut l) = lines.lock() {
            l.push((stream, line.to_string()));
        }
    }));
    Ok(spec)
}

#[test]
fn launcher_runs_ranks_that_rendezvous_and_prefixes_their_lines() -> anyhow::Result<()> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    launch(spec("ok", lines.clone())?)?;
    let lines = lines.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    for rank in 0..2 {
        let want = format!("[rank {rank}] rank {rank} of 2: sum 3");
        assert!(
            lines
                .iter()
                .any(|(s, l)| *s == Stream::Stderr && *l == want),
            "{want} missing: {lines:?}"
        );
    }
    Ok(())
}

#[test]
fn killing_one_rank_stops_the_others_and_fails_naming_it() -> anyhow::Result<()> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let err = match launch(spec("kill", lines)?) {
        Err(e) => e,
        Ok(()) => anyhow::bail!("the launch succeeded although rank 1 was killed"),
    };
    let elapsed = started.elapsed();
    assert!(
        matches!(err, LaunchError::RankFailed { rank: 1, .. }),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.starts_with("rank 1 was killed by signal 9 (SIGKILL)"),
        "{message}"
    );
    assert!(
        elapsed < Duration::from_secs(20),
        "rank 0 was not stopped promptly: {elapsed:?}"
    );
    Ok(())
}

#[test]
fn nproc_flag_is_removed_from_the_ranks_command_line() {
    let args = ["train", "--nproc", "2", "--steps", "3", "--nproc=4"].map(OsString::from);
    let kept = args_without_nproc(args);
    assert_eq!(kept, ["train", "--steps", "3"].map(OsString::from));
}
