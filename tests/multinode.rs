//! Two machines on one box: two torchrun agents (`--nnodes 2 --node-rank k --nproc-per-node 2`,
//! torchrun from `.deps/hfvenv`, made by scripts/setup/setup.sh) stand for two nodes of two ranks.
//! - When one "node" dies (its agent and ranks killed with SIGKILL), the other node's ranks
//!   stop within 60 s, naming the lost ranks (the trainer's heartbeats, not the 300 s
//!   collective timeout); the run then resumes on one node from its last complete checkpoint
//!   and trains the same samples to the same loss as an uninterrupted 4-rank run.
//! - When only one node's torchrun agent dies (SIGKILL; its ranks run in sessions of their
//!   own), its ranks stop with it, the other node stops within 60 s naming them, no process
//!   of the run is left, and the run resumes on the same samples to the same losses.
//! - A node whose `--out` is not rank 0's run folder fails at once, saying so.
//! - Under HYBRID_SHARD, nodes started with different `--nproc-per-node` are refused at once.
//! - HYBRID_SHARD over the two nodes trains to the losses of FULL_SHARD over four ranks on one
//!   node (stage 1, and a full fine-tune of projector and LM), sending fewer bytes across nodes
//!   than FULL_SHARD sends in all.
#![cfg(feature = "train")]
use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support;
use support::metrics::read_metrics;
use support::{
    binary, ensure_nothing_left, fixture, run_ok, tessera, train_command, Fixture, TrainArgs,
};

/// `python -m torch.distributed.run` is torchrun (the `torchrun` script itself sits beside
/// .deps/venv's python, which cannot import torch's CUDA libraries).
fn python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".deps/hfvenv/bin/python")
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn args(f: &Fixture) -> TrainArgs<'_> {
    args_at(f, 1)
}

fn args_at(f: &Fixture, stage: u8) -> TrainArgs<'_> {
    TrainArgs {
        shards: f.shards.as_os_str(),
        lm: &f.lm,
        stage,
        token_budget: 256,
    }
}

/// Node `node` of two (store at `port`) with `nproc` ranks, logging into `log`; `pause_at`
/// stops its ranks inside that step's checkpoint.
fn node(
    f: &Fixture,
    (node, port, nproc): (usize, u16, usize),
    out: &Path,
    extra: &[&str],
    log: &Path,
    pause_at: Option<&str>,
    stage: u8,
) -> Result<Child> {
    let mut cmd = Command::new(python());
    cmd.args([
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--master-addr",
        "127.0.0.1",
    ])
    .args([
        "--nproc-per-node",
        &nproc.to_string(),
        "--node-rank",
        &node.to_string(),
        "--master-port",
        &port.to_string(),
    ])
    .arg("--no-python")
    .arg(binary());
    let mut cmd = train_command(cmd, f, args_at(f, stage), out, extra);
    if let Some(step) = pause_at {
        cmd.env("TESSERA_CHECKPOINT_PAUSE_AT", step);
    }
    let file = std::fs::File::create(log)?;
    cmd.stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .with_context(|| {
            format!(
                "starting torchrun with {} (scripts/setup/setup.sh)",
                python().display()
            )
        })
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    while !done()? {
        ensure!(start.elapsed() < limit, "no {what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Kills a "node": its torchrun agent and the ranks it started (torchrun gives each rank a
/// session of its own, so they are the agent's children, not its process group).
fn kill_node(agent: &Child) -> Result<()> {
    signal_node(agent, "-KILL")
}

/// Sends `signal` to a node's agent and ranks.
fn signal_node(agent: &Child, signal: &str) -> Result<()> {
    let children = Command::new("pgrep")
        .args(["-P", &agent.id().to_string()])
        .output()?;
    let mut pids: Vec<String> = String::from_utf8_lossy(&children.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    pids.push(agent.id().to_string());
    let _ = Command::new("kill").arg(signal).args(&pids).status()?;
    Ok(())
}

/// Both "nodes" started on `run` (logs `run`.node0.log / .node1.log), returned once two steps
/// are in the metrics; node 0 exiting before that fails with its log.
fn two_nodes_past_step_2(
    f: &Fixture,
    run: &Path,
    extra: &[&str],
    stage: u8,
) -> Result<(Child, Child, PathBuf, PathBuf)> {
    let port = free_port()?;
    let (log0, log1) = (
        run.with_extension("node0.log"),
        run.with_extension("node1.log"),
    );
    let mut node0 = node(f, (0, port, 2), run, extra, &log0, None, stage)?;
    let node1 = node(f, (1, port, 2), run, extra, &log1, None, stage)?;
    wait_until("two steps", Duration::from_secs(240), || {
        if let Some(status) = node0.try_wait()? {
            anyhow::bail!(
                "node 0 exited ({status}): {}",
                std::fs::read_to_string(&log0)?
            );
        }
        let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap_or_default();
        Ok(metrics.lines().count() >= 2)
    })?;
    Ok((node0, node1, log0, log1))
}

/// Node 0's exit status once node 1 is dead; still running after 60 s, it is killed and the
/// test fails with its log.
fn exit_within_60_s(node0: &mut Child, log0: &Path) -> Result<std::process::ExitStatus> {
    let killed = Instant::now();
    loop {
        if let Some(status) = node0.try_wait()? {
            return Ok(status);
        }
        if killed.elapsed() > Duration::from_secs(60) {
            kill_node(node0)?;
            anyhow::bail!(
                "node 0 still ran 60 s after node 1 died: {}",
                std::fs::read_to_string(log0)?
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn samples_by_step(run: &Path) -> Result<Vec<String>> {
    Ok(std::fs::read_to_string(run.join("plan.jsonl"))?
        .lines()
        .map(str::to_string)
        .collect())
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "pauses a checkpoint write through TESSERA_CHECKPOINT_PAUSE_AT: --features test-hooks"
)]
fn a_dead_node_stops_the_other_within_60_s_naming_its_ranks_and_the_run_resumes_on_one_node(
) -> Result<()> {
    let f = fixture(300, 0.0)?;
    let steps = ["--steps", "12", "--checkpoint-every", "2"];
    let straight = f.root.join("straight");
    run_ok(train_command(tessera(), &f, args(&f), &straight, &steps).args(["--nproc", "4"]))?;

    let run = f.root.join("run");
    let port = free_port()?;
    let (log0, log1) = (f.root.join("node0.log"), f.root.join("node1.log"));
    let mut node0 = node(&f, (0, port, 2), &run, &steps, &log0, None, 1)?;
    // Node 1's ranks stop inside the step-6 checkpoint write, holding everyone at that step.
    let mut node1 = node(&f, (1, port, 2), &run, &steps, &log1, Some("6"), 1)?;
    let paused = run.join("checkpoints/step-00000006.tmp/rank-00002/shards.safetensors");
    wait_until("step-6 write by node 1", Duration::from_secs(240), || {
        if let Some(status) = node0.try_wait()? {
            anyhow::bail!(
                "node 0 exited ({status}): {}",
                std::fs::read_to_string(&log0)?
            );
        }
        Ok(paused.exists())
    })?;
    kill_node(&node1)?;
    node1.wait()?;
    let killed = Instant::now();
    let status = exit_within_60_s(&mut node0, &log0)?;
    // Node 0's agent has exited: none of its ranks, nor node 1's, is still running.
    ensure_nothing_left(&run)?;
    let log = std::fs::read_to_string(&log0)?;
    ensure!(
        !status.success(),
        "node 0 exited successfully after losing node 1: {log}"
    );
    // Dead peers close their sockets on this box, so gloo fails at once; the heartbeats then
    // tell which ranks are gone.
    ensure!(
        log.contains("ranks [2, 3] stopped sending heartbeats"),
        "node 0's ranks do not name the lost ranks 2 and 3: {log}"
    );
    eprintln!(
        "node 0 stopped {:.1} s after node 1 died",
        killed.elapsed().as_secs_f64()
    );

    // One node, two ranks, from the last complete checkpoint (step 4): the same samples and
    // the same final loss as the uninterrupted four-rank run.
    run_ok(
        train_command(tessera(), &f, args(&f), &run, &steps).args(["--nproc", "2", "--resume"]),
    )?;
    assert_eq!(samples_by_step(&run)?, samples_by_step(&straight)?);
    let last = |dir: &Path| -> Result<f64> {
        Ok(read_metrics(&dir.join("metrics.jsonl"))?
            .last()
            .context("metrics")?
            .loss)
    };
    let (a, b) = (last(&run)?, last(&straight)?);
    ensure!(
        (a - b).abs() <= 1e-3 * b.abs(),
        "loss at step 12: {a} resumed vs {b} straight"
    );
    let record = std::fs::read_to_string(run.join("resumes.jsonl"))?;
    let record: serde_json::Value =
        serde_json::from_str(record.lines().last().context("a resume record")?)?;
    assert_eq!(record["step"], 4);
    assert_eq!(record["checkpoint_world_size"], 4);
    assert_eq!(record["world_size"], 2);
    Ok(())
}

/// torchrun gives each rank a session of its own, so killing an agent alone leaves its ranks
/// running: they must notice and stop (the parent-death signal each rank asks for at start).
#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "pauses a checkpoint write through TESSERA_CHECKPOINT_PAUSE_AT: --features test-hooks"
)]
fn a_lost_agent_takes_its_ranks_the_other_node_stops_naming_them_and_the_run_resumes() -> Result<()>
{
    let f = fixture(200, 0.0)?;
    let steps = ["--steps", "8", "--checkpoint-every", "2"];
    let straight = f.root.join("straight");
    run_ok(train_command(tessera(), &f, args(&f), &straight, &steps).args(["--nproc", "4"]))?;

    let run = f.root.join("run");
    let hybrid: Vec<&str> = steps
        .iter()
        .copied()
        .chain(["--strategy", "hybrid_shard"])
        .collect();
    let port = free_port()?;
    let (log0, log1) = (f.root.join("node0.log"), f.root.join("node1.log"));
    let mut node0 = node(&f, (0, port, 2), &run, &hybrid, &log0, None, 1)?;
    // Node 1's ranks stop inside the step-4 write, holding everyone at that step.
    let mut node1 = node(&f, (1, port, 2), &run, &hybrid, &log1, Some("4"), 1)?;
    wait_until(
        "step-4 write paused on node 1",
        Duration::from_secs(240),
        || {
            if let Some(status) = node0.try_wait()? {
                anyhow::bail!(
                    "node 0 exited ({status}): {}",
                    std::fs::read_to_string(&log0)?
                );
            }
            // Both of node 1's ranks say so (TESSERA_CHECKPOINT_PAUSE_AT's warning).
            let log = std::fs::read_to_string(&log1).unwrap_or_default();
            Ok(log.matches("pausing inside the checkpoint write").count() >= 2)
        },
    )?;
    // The agent alone: its ranks are not in its process group, and nobody signals them.
    let _ = Command::new("kill")
        .args(["-KILL", &node1.id().to_string()])
        .status()?;
    node1.wait()?;
    let killed = Instant::now();
    let status = loop {
        if let Some(status) = node0.try_wait()? {
            break status;
        }
        if killed.elapsed() > Duration::from_secs(60) {
            kill_node(&node0)?;
            for pid in support::processes_naming(&run) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
            anyhow::bail!(
                "node 0 still ran 60 s after node 1's agent died: {}",
                std::fs::read_to_string(&log0)?
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stopped = killed.elapsed();
    // Node 1's orphaned ranks are gone too (no process names the run folder any more).
    ensure_nothing_left(&run)?;
    let log = std::fs::read_to_string(&log0)?;
    ensure!(
        !status.success(),
        "node 0 exited successfully after losing node 1's agent: {log}"
    );
    ensure!(
        log.contains("ranks [2, 3] stopped sending heartbeats"),
        "node 0's ranks do not name the lost ranks 2 and 3: {log}"
    );
    eprintln!(
        "node 0 stopped {:.1} s after node 1's agent died",
        stopped.as_secs_f64()
    );

    // The same two nodes again, from the last complete checkpoint (step 2): the same samples
    // and the same losses as the uninterrupted run.
    let resume: Vec<&str> = hybrid.iter().copied().chain(["--resume"]).collect();
    let port = free_port()?;
    let mut node0 = node(&f, (0, port, 2), &run, &resume, &log0, None, 1)?;
    let mut node1 = node(&f, (1, port, 2), &run, &resume, &log1, None, 1)?;
    let (s0, s1) = (node0.wait()?, node1.wait()?);
    ensure!(
        s0.success() && s1.success(),
        "the resumed run failed: {}{}",
        std::fs::read_to_string(&log0)?,
        std::fs::read_to_string(&log1)?
    );
    assert_eq!(samples_by_step(&run)?, samples_by_step(&straight)?);
    let (got, want) = (
        read_metrics(&run.join("metrics.jsonl"))?,
        read_metrics(&straight.join("metrics.jsonl"))?,
    );
    assert_eq!(got.len(), 8, "8 steps after the resume");
    for (a, b) in got.iter().zip(&want) {
        ensure!(
            (a.loss - b.loss).abs() <= 1e-4 * b.loss.abs(),
            "step {}: loss {} resumed (HYBRID_SHARD) vs {} straight (FULL_SHARD)",
            a.step,
            a.loss,
            b.loss
        );
    }
    let record = std::fs::read_to_string(run.join("resumes.jsonl"))?;
    let record: serde_json::Value =
        serde_json::from_str(record.lines().last().context("a resume record")?)?;
    assert_eq!(record["step"], 2);
    Ok(())
}

#[test]
fn a_node_without_rank_0s_run_folder_fails_at_once_saying_so() -> Result<()> {
    let f = fixture(60, 0.0)?;
    let port = free_port()?;
    let steps = ["--steps", "4"];
    let (log0, log1) = (f.root.join("node0.log"), f.root.join("node1.log"));
    let mut node0 = node(
        &f,
        (0, port, 2),
        &f.root.join("shared"),
        &steps,
        &log0,
        None,
        1,
    )?;
    let mut node1 = node(
        &f,
        (1, port, 2),
        &f.root.join("local-only"),
        &steps,
        &log1,
        None,
        1,
    )?;
    let started = Instant::now();
    let status = node1.wait()?;
    let log = std::fs::read_to_string(&log1)?;
    kill_node(&node0)?;
    node0.wait()?;
    ensure!(
        !status.success(),
        "node 1 trained into a folder rank 0 does not see: {log}"
    );
    ensure!(
        log.contains("is not the run folder rank 0 writes") && log.contains("every node shares"),
        "node 1's error does not explain the run folder: {log}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(120),
        "node 1 took {:?} to fail",
        started.elapsed()
    );
    Ok(())
}

/// A node that hangs without closing its connections (here: stopped with SIGSTOP, as a machine
/// that froze or fell off the network) is found by the heartbeats alone: the other node stops
/// within 60 s (the 30 s default timeout), naming its ranks, instead of waiting out the 300 s
/// collective timeout.
#[test]
fn a_frozen_node_is_found_by_its_missing_heartbeats_within_60_s() -> Result<()> {
    let f = fixture(120, 0.0)?;
    // 10 s instead of the default 30 s: the same path, 20 s less of the suite's time.
    let steps = [
        "--steps",
        "400",
        "--checkpoint-every",
        "0",
        "--heartbeat-timeout",
        "10",
    ];
    let run = f.root.join("run");
    let (mut node0, mut node1, log0, _) = two_nodes_past_step_2(&f, &run, &steps, 1)?;
    signal_node(&node1, "-STOP")?;
    let frozen = Instant::now();
    let status = loop {
        if let Some(status) = node0.try_wait()? {
            break status;
        }
        if frozen.elapsed() > Duration::from_secs(60) {
            kill_node(&node0)?;
            kill_node(&node1)?;
            anyhow::bail!(
                "node 0 still ran 60 s after node 1 froze: {}",
                std::fs::read_to_string(&log0)?
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    kill_node(&node1)?;
    node1.wait()?;
    ensure_nothing_left(&run)?;
    let log = std::fs::read_to_string(&log0)?;
    ensure!(
        !status.success(),
        "node 0 exited successfully after node 1 froze: {log}"
    );
    ensure!(
        log.contains("ranks [2, 3] sent no heartbeat for 10s"),
        "node 0's ranks do not name the frozen ranks 2 and 3: {log}"
    );
    eprintln!(
        "node 0 stopped {:.1} s after node 1 froze",
        frozen.elapsed().as_secs_f64()
    );
    Ok(())
}

fn losses_and_bytes(run: &Path) -> Result<(Vec<f64>, u64, u64)> {
    let steps = read_metrics(&run.join("metrics.jsonl"))?;
    let losses = steps.iter().map(|m| m.loss).collect();
    let sent = steps.iter().map(|m| m.bytes_sent).sum();
    let across = steps.iter().map(|m| m.bytes_sent_across_nodes).sum();
    Ok((losses, sent, across))
}

#[test]
fn hybrid_shard_on_two_nodes_matches_full_shard_on_four_ranks() -> Result<()> {
    let f = fixture(200, 0.0)?;
    for (name, stage, steps) in [
        ("stage1", 1, vec!["--steps", "8"]),
        (
            "full",
            2,
            vec!["--steps", "8", "--train", "projector,lm", "--lm-lr", "1e-3"],
        ),
    ] {
        let full = f.root.join(format!("{name}-full"));
        run_ok(
            train_command(tessera(), &f, args_at(&f, stage), &full, &steps).args(["--nproc", "4"]),
        )?;
        let hybrid = f.root.join(format!("{name}-hybrid"));
        let mut steps_h = steps.clone();
        steps_h.extend(["--strategy", "hybrid_shard"]);
        let port = free_port()?;
        let (log0, log1) = (f.root.join("h0.log"), f.root.join("h1.log"));
        let mut node0 = node(&f, (0, port, 2), &hybrid, &steps_h, &log0, None, stage)?;
        let mut node1 = node(&f, (1, port, 2), &hybrid, &steps_h, &log1, None, stage)?;
        let (s0, s1) = (node0.wait()?, node1.wait()?);
        ensure!(
            s0.success() && s1.success(),
            "{name}: hybrid run failed: {}{}",
            std::fs::read_to_string(&log0)?,
            std::fs::read_to_string(&log1)?
        );
        let (want, full_sent, _) = losses_and_bytes(&full)?;
        let (got, _, across) = losses_and_bytes(&hybrid)?;
        assert_eq!(got.len(), 8, "{name}: 8 steps");
        for (step, (a, b)) in got.iter().zip(&want).enumerate() {
            ensure!(
                (a - b).abs() <= 1e-4 * b.abs(),
                "{name} step {step}: HYBRID_SHARD loss {a} vs FULL_SHARD {b}"
            );
        }
        ensure!(
            across > 0 && across < full_sent,
            "{name}: {across} bytes across nodes vs FULL_SHARD's {full_sent} in all (rank 0)"
        );
        eprintln!("{name}: rank 0 sent {across} bytes across nodes (hybrid) vs {full_sent} (FULL_SHARD, all)");
    }
    Ok(())
}

#[test]
fn hybrid_shard_refuses_nodes_with_different_rank_counts_at_once() -> Result<()> {
    let f = fixture(60, 0.0)?;
    let port = free_port()?;
    let run = f.root.join("run");
    let steps = ["--steps", "4", "--strategy", "hybrid_shard"];
    let (log0, log1) = (f.root.join("node0.log"), f.root.join("node1.log"));
    let started = Instant::now();
    let mut node0 = node(&f, (0, port, 2), &run, &steps, &log0, None, 1)?;
    let mut node1 = node(&f, (1, port, 1), &run, &steps, &log1, None, 1)?;
    let (s0, s1) = (node0.wait()?, node1.wait()?);
    let logs = std::fs::read_to_string(&log0)? + &std::fs::read_to_string(&log1)?;
    ensure!(
        !s0.success() && !s1.success(),
        "a mismatched layout trained: {logs}"
    );
    ensure!(
        logs.contains("HYBRID_SHARD needs every node to run the same --nproc-per-node")
            && logs.contains("[2, 2, 1]"),
        "the error does not name the layout: {logs}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(90),
        "took {:?}",
        started.elapsed()
    );
    Ok(())
}

/// A master port another process holds: node 0's torchrun cannot host the job's store there
/// and the launch fails at once with the reason, instead of waiting for ranks.
#[test]
fn a_master_port_in_use_fails_the_launch_at_once() -> Result<()> {
    let f = fixture(20, 0.0)?;
    let holder = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = holder.local_addr()?.port();
    let log = f.root.join("node0.log");
    let started = Instant::now();
    let mut node0 = node(
        &f,
        (0, port, 2),
        &f.root.join("run"),
        &["--steps", "2"],
        &log,
        None,
        1,
    )?;
    let status = loop {
        if let Some(status) = node0.try_wait()? {
            break status;
        }
        if started.elapsed() > Duration::from_secs(90) {
            kill_node(&node0)?;
            anyhow::bail!("a launch on a taken port still ran after 90 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = std::fs::read_to_string(&log)?;
    ensure!(
        !status.success(),
        "a launch on a taken port succeeded: {text}"
    );
    ensure!(
        text.contains(&port.to_string()),
        "the error does not name port {port}: {text}"
    );
    drop(holder);
    Ok(())
}

/// Starts both "nodes" on `out` and waits for both to succeed (at most `limit`).
fn two_nodes_ok(f: &Fixture, out: &Path, extra: &[&str], stage: u8, limit: Duration) -> Result<()> {
    let port = free_port()?;
    let logs = [
        out.with_extension("node0.log"),
        out.with_extension("node1.log"),
    ];
    let mut nodes = Vec::new();
    for (k, log) in logs.iter().enumerate() {
        nodes.push(node(f, (k, port, 2), out, extra, log, None, stage)?);
    }
    let started = Instant::now();
    for (k, agent) in nodes.iter_mut().enumerate() {
        loop {
            if let Some(status) = agent.try_wait()? {
                ensure!(
                    status.success(),
                    "node {k} failed: {}",
                    std::fs::read_to_string(&logs[k])?
                );
                break;
            }
            if started.elapsed() > limit {
                for agent in &nodes {
                    kill_node(agent)?;
                }
                anyhow::bail!("the two nodes did not finish within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

/// `--expert-parallel 2` over two torchrun agents of two ranks each (each node's ranks one
/// expert group; each expert sharded over its two holders, one per node), a full fine-tune of
/// init-model's tiny Qwen3-MoE: the losses of the same run on one node with four ranks. Then,
/// with one node killed mid-run, the other's ranks stop within 60 s naming ranks 2 and 3
/// (every micro-step runs the experts' all-to-all, the collective a lost peer fails first).
#[test]
fn expert_parallel_over_two_nodes_matches_one_node_and_a_dead_node_is_named() -> Result<()> {
    let f = support::fixture_with(48, 0.0, support::Lm::Tiny("qwen3_moe"))?;
    let extra = [
        "--steps",
        "3",
        "--train",
        "projector,lm",
        "--lm-lr",
        "1e-3",
        "--expert-parallel",
        "2",
        "--recompute",
        "none",
    ];
    let one = f.root.join("one_node");
    run_ok(train_command(tessera(), &f, args_at(&f, 2), &one, &extra).args(["--nproc", "4"]))?;
    let two = f.root.join("two_nodes");
    two_nodes_ok(&f, &two, &extra, 2, Duration::from_secs(300))?;
    let losses = |run: &Path| -> Result<Vec<f64>> {
        Ok(read_metrics(&run.join("metrics.jsonl"))?
            .iter()
            .map(|m| m.loss)
            .collect())
    };
    let (a, b) = (losses(&one)?, losses(&two)?);
    ensure!(a.len() == 3 && b.len() == 3, "{a:?} {b:?}");
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        ensure!(
            (x - y).abs() <= 1e-5 * x.abs(),
            "step {step}: two nodes {y} vs one node {x}"
        );
    }

    let long = [&["--steps", "200"], &extra[2..]].concat();
    let run = f.root.join("dies");
    let (mut node0, mut node1, log0, _) = two_nodes_past_step_2(&f, &run, &long, 2)?;
    kill_node(&node1)?;
    node1.wait()?;
    let killed = Instant::now();
    let status = exit_within_60_s(&mut node0, &log0)?;
    ensure_nothing_left(&run)?;
    let log = std::fs::read_to_string(&log0)?;
    ensure!(
        !status.success(),
        "node 0 succeeded after losing node 1: {log}"
    );
    ensure!(
        log.contains("ranks [2, 3] stopped sending heartbeats"),
        "node 0's ranks do not name the lost ranks 2 and 3: {log}"
    );
    eprintln!(
        "EP: node 0 stopped {:.1} s after node 1 died; all-to-all named: {}",
        killed.elapsed().as_secs_f64(),
        log.contains("all-to-all")
    );
    Ok(())
}
