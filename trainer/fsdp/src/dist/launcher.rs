//! `--nproc N`: starts N local ranks of a program with the torchrun environment (RANK,
//! WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), forwards their stdout and
//! stderr line by line prefixed with `[rank R]`, and supervises them with tokio: when one rank
//! fails (non-zero exit or a signal) the others get SIGTERM, then SIGKILL after a grace period,
//! and the launch fails naming the rank that failed first.
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};

/// Which stream of a rank a log line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Receives every prefixed log line of every rank.
pub type LogSink = Arc<dyn Fn(Stream, &str) + Send + Sync>;

/// What to launch and how.
pub struct LaunchSpec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub nproc: usize,
    /// TCP port of rank 0's store; None picks a free one.
    pub master_port: Option<u16>,
    /// How long a rank may take to exit after SIGTERM before it is killed.
    pub grace: Duration,
    /// Where prefixed lines go; None prints them to this process's stdout / stderr.
    pub log: Option<LogSink>,
    /// Extra environment variables for every rank.
    pub env: Vec<(OsString, OsString)>,
}

impl LaunchSpec {
    /// Re-launches the running executable with `args` (the command line minus `--nproc`).
    pub fn current_exe(nproc: usize, args: Vec<OsString>) -> Result<LaunchSpec, LaunchError> {
        let program = std::env::current_exe().map_err(LaunchError::CurrentExe)?;
        Ok(LaunchSpec {
            program,
            args,
            nproc,
            master_port: None,
            grace: Duration::from_secs(5),
            log: None,
            env: Vec::new(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("--nproc must be at least 1")]
    NoRanks,
    #[error("cannot locate the running executable")]
    CurrentExe(#[source] std::io::Error),
    #[error("cannot find a free TCP port for the rendezvous")]
    Port(#[source] std::io::Error),
    #[error("cannot start rank {rank} ({program})")]
    Spawn {
        rank: usize,
        program: String,
        source: std::io::Error,
    },
    #[error("waiting for rank {rank} failed")]
    Wait { rank: usize, source: std::io::Error },
    #[error("rank {rank} {status}; stopped the other {stopped} rank(s)")]
    RankFailed {
        rank: usize,
        status: String,
        stopped: usize,
    },
    #[error("interrupted; stopped all {0} rank(s)")]
    Interrupted(usize),
    #[error("cannot start the tokio runtime")]
    Runtime(#[source] std::io::Error),
}

/// Starts the ranks and supervises them until all succeed or one fails (blocking: runs
/// [`run_ranks`] on a small tokio runtime).
pub fn launch(spec: LaunchSpec) -> Result<(), LaunchError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(LaunchError::Runtime)?
        .block_on(run_ranks(spec))
}

/// A killed launcher (even by SIGKILL, which it cannot trap) takes its ranks with it: each
/// rank asks the kernel for SIGKILL when the thread that started it ends. That thread is the
/// caller of [`launch`] (`block_on` runs [`run_ranks`] on it), which lives until the launch
/// is over. Without this a rank left behind would wait on its peers until a collective timed
/// out, holding its memory and cores.
fn die_with_launcher(command: &mut Command) {
    let launcher = std::process::id() as libc::pid_t;
    // SAFETY: runs in the child between fork and exec, and calls only async-signal-safe
    // functions (prctl, getppid, _exit).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher died before the request took effect: nobody would kill this rank.
            if libc::getppid() != launcher {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Removes `--nproc N` / `--nproc=N` from a command line so ranks do not launch again.
pub fn args_without_nproc(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip_value = false;
    for arg in args {
        if skip_value {
            skip_value = false;
        } else if arg == "--nproc" {
            skip_value = true;
        } else if !arg.to_string_lossy().starts_with("--nproc=") {
            out.push(arg);
        }
    }
    out
}

/// Starts the ranks and supervises them until all succeed or one fails.
async fn run_ranks(spec: LaunchSpec) -> Result<(), LaunchError> {
    if spec.nproc == 0 {
        return Err(LaunchError::NoRanks);
    }
    let port = match spec.master_port {
        Some(p) => p,
        None => free_port().map_err(LaunchError::Port)?,
    };
    let sink: LogSink = spec.log.clone().unwrap_or_else(|| Arc::new(print_line));
    let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<(usize, std::io::Result<ExitStatus>)>();
    let mut stoppers = Vec::new();
    let mut pumps = Vec::new();
    for rank in 0..spec.nproc {
        let mut command = Command::new(&spec.program);
        die_with_launcher(&mut command);
        let mut child = command
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", spec.nproc.to_string())
            .env("LOCAL_WORLD_SIZE", spec.nproc.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| LaunchError::Spawn {
                rank,
                program: spec.program.display().to_string(),
                source,
            })?;
        if let Some(out) = child.stdout.take() {
            pumps.push(tokio::spawn(pump(out, rank, Stream::Stdout, sink.clone())));
        }
        if let Some(err) = child.stderr.take() {
            pumps.push(tokio::spawn(pump(err, rank, Stream::Stderr, sink.clone())));
        }
        let (stop_tx, stop_rx) = oneshot::channel();
        stoppers.push(Some(stop_tx));
        tokio::spawn(supervise(child, rank, spec.grace, stop_rx, exit_tx.clone()));
    }
    drop(exit_tx);

    let mut running = spec.nproc;
    let mut failure: Option<LaunchError> = None;
    loop {
        let event = tokio::select! {
            ev = exit_rx.recv() => ev,
            _ = tokio::signal::ctrl_c(), if failure.is_none() => {
                failure = Some(LaunchError::Interrupted(spec.nproc));
                stop_all(&mut stoppers);
                continue;
            }
        };
        let Some((rank, status)) = event else { break };
        running -= 1;
        stoppers[rank] = None;
        let status = match status {
            Ok(s) => s,
            Err(source) => {
                failure.get_or_insert(LaunchError::Wait { rank, source });
                stop_all(&mut stoppers);
                continue;
            }
        };
        if !status.success() && failure.is_none() {
            failure = Some(LaunchError::RankFailed {
                rank,
                status: describe(status),
                stopped: running,
            });
            stop_all(&mut stoppers);
        }
    }
    for p in pumps {
        let _ = p.await;
    }
    failure.map_or(Ok(()), Err)
}

fn stop_all(stoppers: &mut [Option<oneshot::Sender<()>>]) {
    for s in stoppers.iter_mut() {
        if let Some(tx) = s.take() {
            let _ = tx.send(());
        }
    }
}

/// Waits for one rank; on a stop request sends SIGTERM, then SIGKILL after `grace`.
async fn supervise(
    mut child: Child,
    rank: usize,
    grace: Duration,
    stop: oneshot::Receiver<()>,
    exit: mpsc::UnboundedSender<(usize, std::io::Result<ExitStatus>)>,
) {
    let status = tokio::select! {
        s = child.wait() => s,
        Ok(()) = stop => {
            if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                // SAFETY: plain kill(2) on our own, not yet reaped child.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            match tokio::time::timeout(grace, child.wait()).await {
                Ok(s) => s,
                Err(_) => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            }
        }
    };
    let _ = exit.send((rank, status));
}

async fn pump(reader: impl AsyncRead + Unpin, rank: usize, stream: Stream, sink: LogSink) {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                sink(
                    stream,
                    &format!("[rank {rank}] {}", line.trim_end_matches(['\n', '\r'])),
                );
            }
        }
    }
}

fn print_line(stream: Stream, line: &str) {
    match stream {
        Stream::Stdout => println!("{line}"),
        Stream::Stderr => eprintln!("{line}"),
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}{}", signal_name(sig)),
        (None, None) => format!("ended abnormally ({status})"),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGINT => " (SIGINT)",
        libc::SIGBUS => " (SIGBUS)",
        _ => "",
    }
}

/// A port the OS considers free right now (bound, read, released).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
