//! Collectives from PyTorch's c10d through a small C++ shim (`csrc/c10d_shim.cpp`), rendezvous
//! from the torchrun environment, and the `--nproc N` launcher.
//!
//! 1. `RankEnv::from_env` reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT.
//! 2. `init_process_group` connects to the TCPStore that rank 0 hosts and builds a gloo (CPU)
//!    or NCCL (CUDA, feature `cuda`) process group whose collectives all carry a timeout.
//! 3. [`launch`] starts N local ranks with those variables set, prefixes their log
//!    lines with the rank, and stops the others when one fails.
mod agent;
mod launcher;
mod liveness;
mod process_group;
mod store;

use tessera_sys::c10d as ffi;

pub use agent::{started_by_torchrun, stop_with_torchrun_agent};
pub use launcher::{args_without_nproc, launch, LaunchError, LaunchSpec, LogSink, Stream};
pub use liveness::Liveness;
pub use process_group::{cuda_device_for, Backend, ProcessGroup, Work};
pub use store::{RankEnv, Store};

use std::fmt;
use std::time::Duration;
use tessera_switches::Switches;

/// Default timeout of every collective and of the rendezvous.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// A c10d collective, named as errors and logs print it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    AllGather,
    ReduceScatter,
    AllReduce,
    Broadcast,
    Barrier,
    /// Expert parallelism's token exchange (differentiable, synchronous).
    AllToAll,
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Collective::AllGather => "all-gather",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::AllReduce => "all-reduce",
            Collective::Broadcast => "broadcast",
            Collective::Barrier => "barrier",
            Collective::AllToAll => "all-to-all",
        })
    }
}

/// Errors of rendezvous and collectives; each names the rank and what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("environment variable {var} {message}")]
    Env { var: String, message: String },
    #[error("rendezvous with the TCPStore at {host}:{port} failed: {message}")]
    Store {
        host: String,
        port: u16,
        message: String,
    },
    #[error("rank {rank}: creating the {backend:?} process group failed: {message}")]
    ProcessGroup {
        rank: usize,
        backend: Backend,
        message: String,
    },
    /// The torchrun agent that started this rank is gone, or cannot be followed.
    #[error("{message}")]
    Agent { message: String },
    #[error("{}", collective_message(*rank, *op, unit, *timed_out, *timeout, message))]
    Collective {
        rank: usize,
        op: Collective,
        unit: String,
        timed_out: bool,
        timeout: Duration,
        message: String,
    },
}

fn collective_message(
    rank: usize,
    op: Collective,
    unit: &str,
    timed_out: bool,
    timeout: Duration,
    message: &str,
) -> String {
    if timed_out {
        format!(
            "rank {rank}: {op} of unit '{unit}' timed out after {}s (a peer never joined it: \
             do all ranks run the same units?): {message}",
            fmt_secs(timeout)
        )
    } else {
        format!("rank {rank}: {op} of unit '{unit}' failed: {message}")
    }
}

fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s:.1}")
    }
}

/// Joins the job described by `env`: rank 0 hosts the TCPStore at MASTER_ADDR:MASTER_PORT, every
/// rank connects to it and builds a process group on `backend`. Gloo binds to loopback when the
/// master is local, to `TESSERA_GLOO_HOST` when set, and to this machine's hostname otherwise.
pub fn init_process_group(
    env: &RankEnv,
    backend: Backend,
    timeout: Duration,
) -> Result<ProcessGroup, DistError> {
    let store = Store::connect(
        &env.master_addr,
        env.master_port,
        env.rank == 0,
        env.world_size,
        timeout,
        "tessera",
    )?;
    ProcessGroup::new(
        store,
        env.rank,
        env.world_size,
        backend,
        gloo_host(env).as_deref(),
        timeout,
    )
}

/// The address gloo binds: `TESSERA_GLOO_HOST`, loopback for a local master, else the hostname.
fn gloo_host(env: &RankEnv) -> Option<String> {
    match &Switches::get().gloo_host {
        Some(host) => Some(host.clone()),
        None if is_loopback(&env.master_addr) => Some("127.0.0.1".to_string()),
        None => None,
    }
}

/// The process groups of HYBRID_SHARD, beside the job's own.
pub struct Mesh {
    /// This machine's ranks (rank = LOCAL_RANK).
    pub node: ProcessGroup,
    /// The ranks with this LOCAL_RANK on every machine (rank = node index).
    pub replicas: ProcessGroup,
}

/// Builds the node and replica groups of a job laid out as torchrun lays it out: every machine
/// runs LOCAL_WORLD_SIZE ranks, numbered machine by machine. `counts` is every rank's
/// LOCAL_WORLD_SIZE (all-gathered by the caller over the whole job), so a machine started with
/// another `--nproc-per-node` is refused on every rank, naming the counts.
pub fn hybrid_mesh(
    env: &RankEnv,
    counts: &[usize],
    backend: Backend,
    timeout: Duration,
) -> Result<Mesh, DistError> {
    let local = env.local_world_size;
    let uniform = counts.iter().all(|&c| c == local)
        && env.world_size.is_multiple_of(local)
        && env.rank % local == env.local_rank;
    if !uniform {
        return Err(DistError::Env {
            var: "LOCAL_WORLD_SIZE".into(),
            message: format!(
                "differs between machines or ranks are not numbered machine by machine (rank {} \
                 is LOCAL_RANK {} of {local}; per rank: {counts:?}): HYBRID_SHARD needs every \
                 node to run the same --nproc-per-node",
                env.rank, env.local_rank
            ),
        });
    }
    let (node, nodes) = (env.rank / local, env.world_size / local);
    let group = |prefix: String, rank: usize, size: usize| {
        subgroup(env, prefix, rank, size, backend, timeout)
    };
    Ok(Mesh {
        node: group(format!("tessera/node{node}"), env.local_rank, local)?,
        replicas: group(format!("tessera/replica{}", env.local_rank), node, nodes)?,
    })
}

/// Expert parallelism's groups for `--expert-parallel n`, torchtitan's layout: rank r's
/// expert group is the n consecutive ranks from n⌊r/n⌋ (in which it is rank r mod n and holds
/// that slice of every sparse layer's experts); its expert-replica group is the W/n ranks
/// r mod n, r mod n + n, ... holding the same slice (in which it is rank ⌊r/n⌋), over which
/// those experts are sharded.
pub struct ExpertMesh {
    pub experts: ProcessGroup,
    pub replicas: ProcessGroup,
    /// The job ranks of `replicas`, in its rank order.
    pub replica_ranks: Vec<usize>,
}

/// Builds this rank's [`ExpertMesh`] (every rank of the job calls it with the same `n`, which
/// divides the world size).
pub fn expert_mesh(
    env: &RankEnv,
    n: usize,
    backend: Backend,
    timeout: Duration,
) -> Result<ExpertMesh, DistError> {
    if n == 0 || !env.world_size.is_multiple_of(n) {
        return Err(DistError::Env {
            var: "WORLD_SIZE".into(),
            message: format!(
                "is {}, which --expert-parallel {n} does not divide (expert groups of {n} \
                 consecutive ranks)",
                env.world_size
            ),
        });
    }
    let (block, slice) = (env.rank / n, env.rank % n);
    let experts = subgroup(
        env,
        format!("tessera/ep{block}"),
        slice,
        n,
        backend,
        timeout,
    )?;
    let replicas = subgroup(
        env,
        format!("tessera/ep_replica{slice}"),
        block,
        env.world_size / n,
        backend,
        timeout,
    )?;
    Ok(ExpertMesh {
        experts,
        replicas,
        replica_ranks: (0..env.world_size / n).map(|i| slice + i * n).collect(),
    })
}

/// The group `prefix` of `size` ranks over the job's store, this rank being `rank` in it.
fn subgroup(
    env: &RankEnv,
    prefix: String,
    rank: usize,
    size: usize,
    backend: Backend,
    timeout: Duration,
) -> Result<ProcessGroup, DistError> {
    let store = Store::connect(
        &env.master_addr,
        env.master_port,
        false,
        size,
        timeout,
        &prefix,
    )?;
    ProcessGroup::new(
        store,
        rank,
        size,
        backend,
        gloo_host(env).as_deref(),
        timeout,
    )
}

fn is_loopback(addr: &str) -> bool {
    addr == "localhost" || addr.starts_with("127.") || addr == "::1"
}

/// `world_size` process groups over loopback in this one process (rank r at index r), for
/// tests and benchmarks that run each rank on its own thread. Rank 0 hosts the store on a free
/// port; the groups are built concurrently because each blocks until all have joined.
pub fn local_groups(world_size: usize, timeout: Duration) -> Result<Vec<ProcessGroup>, DistError> {
    let server = Store::connect("127.0.0.1", 0, true, world_size, timeout, "tessera")?;
    let port = server.port();
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(world_size);
        let mut server = Some(server);
        for rank in 0..world_size {
            let first = server.take();
            handles.push(scope.spawn(move || {
                let store = match first {
                    Some(s) => s,
                    None => {
                        Store::connect("127.0.0.1", port, false, world_size, timeout, "tessera")?
                    }
                };
                ProcessGroup::new(
                    store,
                    rank,
                    world_size,
                    Backend::Gloo,
                    Some("127.0.0.1"),
                    timeout,
                )
            }));
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(panicked_rank())))
            .collect()
    })
}

fn panicked_rank() -> DistError {
    DistError::ProcessGroup {
        rank: usize::MAX,
        backend: Backend::Gloo,
        message: "a rank's set-up thread panicked".into(),
    }
}
