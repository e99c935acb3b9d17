//! A rank that torchrun started stops when its agent dies. torchrun starts each rank in a
//! session of its own (`start_new_session`), so a killed agent takes no rank with it: without
//! this, the ranks of a node whose agent died train on unsupervised, nothing restarts them,
//! and the other nodes wait on them. The `--nproc` launcher does the same for its own ranks
//! (`launcher.rs`, from the fork); here the rank does it itself, at start:
//!
//! 1. it asks the kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`);
//! 2. it checks that its parent is still the agent, since the agent may have died between
//!    starting the rank and step 1 (the kernel then already gave the rank a new parent: init,
//!    or the nearest subreaper, which would never send the signal).
//!
//! Once a rank of a node is gone, the other nodes' ranks find it by its heartbeats
//! (`liveness.rs`) and stop, naming it.
use super::DistError;

/// Whether this process was started by torchrun's agent (torch elastic sets `TORCHELASTIC_*`
/// variables for every worker it starts: the run id, the restart count).
pub fn started_by_torchrun(get: impl Fn(&str) -> Option<String>) -> bool {
    get("TORCHELASTIC_RUN_ID").is_some() || get("TORCHELASTIC_RESTART_COUNT").is_some()
}

/// Steps 1 and 2 of the module docs, for a rank started by torchrun (call it first thing).
/// Fails, naming the parent, when the agent is already gone.
pub fn stop_with_torchrun_agent() -> Result<(), DistError> {
    // SAFETY: prctl with an integer argument changes only this process's own setting.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        return Err(DistError::Agent {
            message: format!(
                "cannot ask the kernel to stop this rank with its torchrun agent: {}",
                std::io::Error::last_os_error()
            ),
        });
    }
    // SAFETY: getppid cannot fail.
    let parent = unsafe { libc::getppid() };
    let own_args: Vec<Vec<u8>> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_encoded_bytes())
        .collect();
    let parent_args = std::fs::read(format!("/proc/{parent}/cmdline")).unwrap_or_default();
    let parent_name = std::fs::read_to_string(format!("/proc/{parent}/comm")).unwrap_or_default();
    if is_agent(parent, &parent_args, parent_name.trim(), &own_args) {
        return Ok(());
    }
    Err(DistError::Agent {
        message: format!(
            "the torchrun agent that started this rank is gone (its parent is now pid {parent}, \
             {}): stopping instead of training unsupervised",
            if parent_name.trim().is_empty() {
                "unknown".to_string()
            } else {
                format!("`{}`", parent_name.trim())
            }
        ),
    })
}

/// Whether the process `pid` (its NUL-separated command line and its name) is the torchrun
/// agent of a rank whose arguments are `own_args` (without the program). torchrun's command
/// line ends with the program and arguments it starts every rank with; a launcher that starts
/// ranks from Python code (torch's `elastic_launch`) is at least a Python interpreter. Init
/// (pid 1) and subreapers (systemd, tini, a container shim) are neither.
fn is_agent(pid: i32, cmdline: &[u8], name: &str, own_args: &[Vec<u8>]) -> bool {
    if pid <= 1 {
        return false;
    }
    let parent_args: Vec<&[u8]> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .collect();
    let holds_ours = !own_args.is_empty()
        && parent_args.len() > own_args.len()
        && parent_args[parent_args.len() - own_args.len()..]
            .iter()
            .zip(own_args)
            .all(|(a, b)| *a == b.as_slice());
    holds_ours || name.starts_with("python") || name == "torchrun"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    fn cmdline(list: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for a in list {
            out.extend_from_slice(a.as_bytes());
            out.push(0);
        }
        out
    }

    #[test]
    fn torchruns_command_line_holding_the_ranks_arguments_is_the_agent() {
        let ours = args(&["train", "--out", "/runs/a"]);
        let agent = cmdline(&[
            "/venv/bin/python",
            "/venv/bin/torchrun",
            "--nnodes",
            "2",
            "--no-python",
            "/bin/tessera",
            "train",
            "--out",
            "/runs/a",
        ]);
        assert!(is_agent(4242, &agent, "torchrun", &ours));
        // `python -m torch.distributed.run` has the interpreter's name.
        assert!(is_agent(4242, &agent, "python3.11", &ours));
        // An agent started otherwise still ends with our arguments.
        assert!(is_agent(4242, &agent, "launcher", &ours));
    }

    #[test]
    fn init_and_subreapers_are_not_the_agent() {
        let ours = args(&["train", "--out", "/runs/a"]);
        assert!(!is_agent(1, &cmdline(&["/sbin/init"]), "systemd", &ours));
        assert!(!is_agent(
            777,
            &cmdline(&["/lib/systemd/systemd", "--user"]),
            "systemd",
            &ours
        ));
        assert!(!is_agent(
            90,
            &cmdline(&["/sbin/tini", "--", "bash", "job.sh"]),
            "tini",
            &ours
        ));
        // Another run's agent is not ours.
        let other = cmdline(&[
            "torchrun",
            "--no-python",
            "/bin/tessera",
            "train",
            "--out",
            "/b",
        ]);
        assert!(!is_agent(555, &other, "launcher", &ours));
    }

    #[test]
    fn torchrun_workers_are_told_by_their_variables() {
        assert!(started_by_torchrun(
            |k| (k == "TORCHELASTIC_RUN_ID").then(|| "none".into())
        ));
        assert!(!started_by_torchrun(|k| (k == "RANK").then(|| "0".into())));
    }
}
