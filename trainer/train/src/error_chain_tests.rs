//! Every top-level error that wraps a cause prints that cause exactly once under anyhow's
//! `{:#}` (the CLI's format: each error of the chain, joined by ": "), and still names what
//! failed (the file, rank or unit).
use crate::{CheckpointError, ExportError, MetricsError, PlotError, TrainError};
use std::path::PathBuf;
use std::time::Duration;
use tessera_fsdp::dist::{Backend, Collective, DistError, LaunchError};
use tessera_fsdp::FsdpError;
use tessera_model::ModelError;

const CAUSE: &str = "the disk is on fire";

fn io_cause() -> std::io::Error {
    std::io::Error::other(CAUSE)
}

fn torch_cause() -> tch::TchError {
    tch::TchError::Torch(CAUSE.into())
}

fn json_cause() -> serde_json::Error {
    match serde_json::from_str::<serde_json::Value>("{") {
        Err(e) => e,
        Ok(v) => panic!("`{{` parsed as JSON: {v}"),
    }
}

fn shard_cause(path: &std::path::Path) -> tessera_shards::ShardError {
    match tessera_shards::sha256_file(path) {
        Err(e) => e,
        Ok(_) => panic!("{} exists", path.display()),
    }
}

/// Formats `err` as the CLI does and checks that `cause` appears exactly once and that the
/// message still names what failed (`names`).
fn assert_printed_once(err: impl Into<anyhow::Error>, cause: &str, names: &str) {
    let text = format!("{:#}", err.into());
    assert_eq!(text.matches(cause).count(), 1, "cause not once in: {text}");
    assert!(text.contains(names), "`{names}` missing from: {text}");
}

fn path() -> PathBuf {
    PathBuf::from("/run/a/thing.json")
}

fn model_errors() -> Vec<(ModelError, String)> {
    let json = json_cause().to_string();
    vec![
        (
            ModelError::Io {
                path: path(),
                source: io_cause(),
            },
            CAUSE.into(),
        ),
        (
            ModelError::Json {
                path: path(),
                source: json_cause(),
            },
            json,
        ),
        (ModelError::Torch(torch_cause()), CAUSE.into()),
    ]
}

#[test]
fn model_errors_print_their_cause_once() {
    for (err, cause) in model_errors() {
        let names = if matches!(err, ModelError::Torch(_)) {
            "torch"
        } else {
            "thing.json"
        };
        assert_printed_once(err, &cause, names);
    }
}

fn fsdp_torch() -> FsdpError {
    FsdpError::Compute {
        rank: 1,
        unit: "layers.3".into(),
        source: torch_cause().into(),
    }
}

fn dist_timeout() -> DistError {
    DistError::Collective {
        rank: 1,
        op: Collective::AllGather,
        unit: "vision".into(),
        timed_out: true,
        timeout: Duration::from_secs(2),
        message: CAUSE.into(),
    }
}

/// A shim that fails in a unit's forward: the message names the rank, the unit and the op.
fn fsdp_shim() -> FsdpError {
    FsdpError::Compute {
        rank: 1,
        unit: "layers.3".into(),
        source: tessera_sys::ShimError {
            op: "varlen attention kernel",
            message: CAUSE.into(),
        }
        .into(),
    }
}

#[test]
fn fsdp_and_dist_errors_print_their_cause_once() {
    assert_printed_once(fsdp_torch(), CAUSE, "layers.3");
    assert_printed_once(
        fsdp_shim(),
        CAUSE,
        "rank 1: unit 'layers.3': varlen attention kernel: ",
    );
    assert_printed_once(FsdpError::Dist(dist_timeout()), CAUSE, "vision");
    assert_printed_once(dist_timeout(), CAUSE, "vision");
    let group = DistError::ProcessGroup {
        rank: 0,
        backend: Backend::Gloo,
        message: CAUSE.into(),
    };
    assert_printed_once(group, CAUSE, "Gloo");
    let spawn = LaunchError::Spawn {
        rank: 1,
        program: "/bin/tessera".into(),
        source: io_cause(),
    };
    assert_printed_once(spawn, CAUSE, "/bin/tessera");
    let wait = LaunchError::Wait {
        rank: 7,
        source: io_cause(),
    };
    assert_printed_once(wait, CAUSE, "rank 7");
    assert_printed_once(LaunchError::Port(io_cause()), CAUSE, "free TCP port");
    assert_printed_once(LaunchError::CurrentExe(io_cause()), CAUSE, "executable");
    assert_printed_once(LaunchError::Runtime(io_cause()), CAUSE, "tokio runtime");
}

#[test]
fn train_errors_print_their_cause_once() {
    let missing = PathBuf::from("/nonexistent/tessera/shard-00000.parquet");
    let shard_cause_text = match shard_cause(&missing) {
        tessera_shards::ShardError::Io { source, .. } => source.to_string(),
        other => panic!("hashing a missing file failed otherwise: {other}"),
    };
    let mut cases: Vec<(TrainError, String, &str)> = vec![
        (
            TrainError::Io {
                path: path(),
                source: io_cause(),
            },
            CAUSE.into(),
            "thing.json",
        ),
        (TrainError::Torch(torch_cause()), CAUSE.into(), "torch"),
        (TrainError::Fsdp(fsdp_torch()), CAUSE.into(), "layers.3"),
        (TrainError::Dist(dist_timeout()), CAUSE.into(), "vision"),
        (
            TrainError::Shards(shard_cause(&missing)),
            shard_cause_text.clone(),
            "shard-00000.parquet",
        ),
        (
            TrainError::Checkpoint(CheckpointError::Io {
                path: path(),
                source: io_cause(),
            }),
            CAUSE.into(),
            "thing.json",
        ),
        (
            TrainError::Checkpoint(CheckpointError::File(shard_cause(&missing))),
            shard_cause_text,
            "shard-00000.parquet",
        ),
        (
            TrainError::Metrics(MetricsError::Io {
                path: path(),
                source: io_cause(),
            }),
            CAUSE.into(),
            "thing.json",
        ),
        (
            TrainError::Metrics(MetricsError::Json {
                path: path(),
                line: 12,
                source: json_cause(),
            }),
            json_cause().to_string(),
            "line 12",
        ),
        (
            TrainError::Plot(PlotError::Write {
                path: "/run/loss.png".into(),
                source: image::ImageError::IoError(io_cause()),
            }),
            CAUSE.into(),
            "loss.png",
        ),
        (
            TrainError::Export(ExportError::Io {
                path: path(),
                source: io_cause(),
            }),
            CAUSE.into(),
            "thing.json",
        ),
        (
            TrainError::Export(ExportError::Model(ModelError::Torch(torch_cause()))),
            CAUSE.into(),
            "torch",
        ),
        (
            TrainError::Export(ExportError::Unreadable {
                run: "/run/a".into(),
                what: "cannot read /run/a/vlm.json".into(),
                source: io_cause().into(),
            }),
            CAUSE.into(),
            "vlm.json",
        ),
        (
            TrainError::Json {
                what: "checkpoint /run/a/checkpoints/step-00000002 rank 0: planner position \
                       is unreadable"
                    .into(),
                source: json_cause(),
            },
            json_cause().to_string(),
            "step-00000002",
        ),
        (
            TrainError::ValidationPlan {
                dir: "/data/val".into(),
                source: tessera_pipeline::plan::PlanError::ZeroBudget,
            },
            "token budget 0 is not a budget".into(),
            "/data/val",
        ),
        (
            TrainError::Config(crate::ConfigError::Stored(json_cause())),
            json_cause().to_string(),
            "stored config",
        ),
    ];
    for (err, cause) in model_errors() {
        let names = if matches!(err, ModelError::Torch(_)) {
            "torch"
        } else {
            "thing.json"
        };
        cases.push((TrainError::Model(err), cause, names));
    }
    for (err, cause, names) in cases {
        assert_printed_once(err, &cause, names);
    }
}
