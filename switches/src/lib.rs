//! Tessera's environment switches: every `TESSERA_*` variable, and `NO_PROGRESS`, read from the
//! process environment once into one typed [`Switches`]. No other module of the workspace reads
//! a `TESSERA_*` variable: a crate that needs a switch depends on this one and reads the field.
//! (Variables of other tools' conventions, such as torchrun's `RANK` or `OMP_NUM_THREADS`, stay
//! with the code that follows the convention.)
//!
//! 1. A program calls [`Switches::load`] first: a value a switch cannot take stops it with an
//!    error naming the variable and the value, before any work.
//! 2. Library code reads [`Switches::get`], which cannot fail: it returns the typed switches
//!    parsed once, in which a variable set to a value it cannot take holds its default. In a
//!    program that cannot happen (step 1 stopped it); where no program checked (a crate's own
//!    tests, a bench), `get` says once on stderr which variable it ignored.
//! 3. Tests build the struct from any lookup with [`Switches::from_lookup`].
//!
//! Why `get` is infallible rather than a `Result`: the switches are read deep in code with no
//! error of its own (each bf16 product asks `TESSERA_CPU_BF16_GEMM`, the loader's thread
//! default, the retry policy), and the only error `get` could return is one a program has
//! already reported at its start, so a `Result` would give ten error enums a variant that
//! never fires.
//!
//! ```
//! use tessera_switches::Switches;
//!
//! let env = |name: &str| (name == "TESSERA_LOADER_THREADS").then(|| "1".into());
//! let switches = Switches::from_lookup(env).unwrap();
//! assert_eq!(switches.loader_threads, Some(1));
//! assert!(switches.side_stream); // unset: the default
//!
//! let env = |name: &str| (name == "TESSERA_LOADER_THREADS").then(|| "two".into());
//! let err = Switches::from_lookup(env).unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     r#"TESSERA_LOADER_THREADS="two": expected a thread count of at least 1"#
//! );
//! ```
use std::cell::RefCell;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Once, OnceLock};
use std::time::Duration;

/// How bf16 matrix products run on the CPU, when `TESSERA_CPU_BF16_GEMM` chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Gemm {
    /// `native`: libtorch's bf16 kernels.
    Native,
    /// `f32`: f32 kernels over the widened bf16 operands, result rounded to bf16.
    F32,
}

/// Every switch, typed; unset variables hold the default their doc comment names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switches {
    /// `TESSERA_SIDE_STREAM`: `0` puts a micro-batch's host-to-device uploads on the compute
    /// stream instead of a CUDA side stream (default `1`: the side stream).
    pub side_stream: bool,
    /// `TESSERA_CPU_BF16_GEMM`: `native` or `f32`, how bf16 matrix products run on the CPU
    /// (default unset: a bf16 training run measures both and records its choice, elsewhere the
    /// CPU's flags decide; see `tessera_model::CpuBf16Gemm`).
    pub cpu_bf16_gemm: Option<Bf16Gemm>,
    /// `TESSERA_DENSE_ATTENTION`: `1` runs packed rows on CUDA through the dense block-causal
    /// mask instead of the varlen kernels (default `0`).
    pub dense_attention: bool,
    /// `TESSERA_LOADER_THREADS`: loader worker threads where no flag or config key sets them
    /// (`1` turns the loader's parallelism off). An explicit `--threads` or `loader_threads`
    /// wins over it (default unset: the core count; `train`: at most 8).
    pub loader_threads: Option<usize>,
    /// `TESSERA_GLOO_HOST`: the address gloo binds in a multi-node job (default unset: loopback
    /// when the master is local, else this machine's hostname).
    pub gloo_host: Option<String>,
    /// `TESSERA_CACHE`: the cache directory of a URL `--shards` when `--cache-dir` is not given
    /// (default unset: `OUT/shard-cache`).
    pub cache_dir: Option<PathBuf>,
    /// `TESSERA_REMOTE_RETRY_S`: seconds an object-store request may keep being retried
    /// (default 120).
    pub remote_retry: Duration,
    /// `TESSERA_REMOTE_RETRIES`: how many times one object-store request is retried at most
    /// (default 10; 0 turns retries off).
    pub remote_retries: usize,
    /// `TESSERA_REMOTE_BACKOFF_MS`: the first wait before retrying an object-store request,
    /// doubled at each retry up to 10 s (default 100).
    pub remote_backoff: Duration,
    /// `TESSERA_REMOTE_TIMEOUT_S`: seconds one object-store request may take, from connecting
    /// to its last byte, before it counts as failed and is retried (default 60).
    pub remote_timeout: Duration,
    /// `TESSERA_REFERENCE_LOADER`: the PIL reference loader script of `tessera bench loader`
    /// (default unset: the repository's `scripts/baselines/pil_loader.py`).
    pub reference_loader: Option<PathBuf>,
    /// `TESSERA_PYTHON`: the Python that runs the PIL reference loader (default unset: the
    /// repository's `.deps/venv`, else `python3` on PATH).
    pub python: Option<PathBuf>,
    /// `TESSERA_BENCH_THREADS`: torch threads of `cargo bench --bench model` (default unset:
    /// all cores).
    pub bench_threads: Option<usize>,
    /// `NO_PROGRESS`, set to any value: no progress bars and no per-step progress line, as with
    /// `--quiet` (default unset).
    pub no_progress: bool,
    /// Test hook, read only by builds with the `test-hooks` feature (`make test`):
    /// `TESSERA_CHECKPOINT_PAUSE_AT=N` stops the write of step N's checkpoint after this
    /// rank's tensor files, before its manifest and the commit, until the process is killed
    /// (default unset).
    pub checkpoint_pause_at: Option<u64>,
    /// Bench hook, read only by builds with the `test-hooks` feature (`scripts/bench/bench_s3.sh`):
    /// `TESSERA_REMOTE_LATENCY_MS` milliseconds slept before every object-store request, a far
    /// store on a near one (default 0).
    pub remote_latency: Duration,
}

/// A switch set to a value it cannot take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchError {
    /// The variable, e.g. `TESSERA_LOADER_THREADS`.
    pub var: &'static str,
    /// Its value as set (lossily decoded when it is not UTF-8).
    pub value: String,
    /// What the variable takes.
    pub expected: &'static str,
}

impl std::fmt::Display for SwitchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}={:?}: expected {}",
            self.var, self.value, self.expected
        )
    }
}

impl std::error::Error for SwitchError {}

/// The process's switches, read once: every variable set to a value it can take, the others at
/// their default, and the first variable that was not (which [`Switches::load`] reports).
struct Read {
    switches: Switches,
    error: Option<SwitchError>,
}

static READ: OnceLock<Read> = OnceLock::new();

fn read() -> &'static Read {
    READ.get_or_init(|| {
        let (switches, error) = Switches::lenient(|name| std::env::var_os(name));
        Read { switches, error }
    })
}

impl Switches {
    /// The process's switches, read from its environment on the first call; every later call
    /// returns the same answer. Programs call it first and stop on the error.
    pub fn load() -> Result<&'static Switches, SwitchError> {
        let read = read();
        match &read.error {
            Some(e) => Err(e.clone()),
            None => Ok(&read.switches),
        }
    }

    /// The process's switches for code with no error path of its own; it cannot fail. After
    /// [`Self::load`] succeeded (every program) they are the environment's. Where no program
    /// checked, a variable set to a value it cannot take holds its default, and the first
    /// call says so on stderr, naming the variable and the value.
    pub fn get() -> &'static Switches {
        static WARNED: Once = Once::new();
        let read = read();
        if let Some(e) = &read.error {
            WARNED.call_once(|| eprintln!("warning: {e}; the switch keeps its default"));
        }
        &read.switches
    }

    /// The switches as `lookup` (a variable's name to its value, `None` when unset) sets them.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Switches, SwitchError> {
        match Self::lenient(lookup) {
            (switches, None) => Ok(switches),
            (_, Some(e)) => Err(e),
        }
    }

    /// The switches as `lookup` sets them, a variable set to a value it cannot take at its
    /// default, and the first such variable.
    fn lenient(lookup: impl Fn(&str) -> Option<OsString>) -> (Switches, Option<SwitchError>) {
        let env = Env {
            lookup,
            first_error: RefCell::new(None),
        };
        let switches = Switches {
            side_stream: env
                .parse("TESSERA_SIDE_STREAM", "0 or 1", flag)
                .unwrap_or(true),
            cpu_bf16_gemm: env.parse("TESSERA_CPU_BF16_GEMM", "native or f32", |v| match v {
                "native" => Some(Bf16Gemm::Native),
                "f32" => Some(Bf16Gemm::F32),
                _ => None,
            }),
            dense_attention: env
                .parse("TESSERA_DENSE_ATTENTION", "0 or 1", flag)
                .unwrap_or(false),
            loader_threads: env.parse(
                "TESSERA_LOADER_THREADS",
                "a thread count of at least 1",
                count,
            ),
            gloo_host: env.parse("TESSERA_GLOO_HOST", "a host name or address", |v| {
                (!v.is_empty()).then(|| v.to_string())
            }),
            cache_dir: env.path("TESSERA_CACHE"),
            remote_retry: Duration::from_secs(
                env.parse("TESSERA_REMOTE_RETRY_S", "whole seconds", number)
                    .unwrap_or(120),
            ),
            remote_retries: env
                .parse("TESSERA_REMOTE_RETRIES", "a number of retries", number)
                .unwrap_or(10),
            remote_backoff: Duration::from_millis(
                env.parse("TESSERA_REMOTE_BACKOFF_MS", "whole milliseconds", number)
                    .unwrap_or(100),
            ),
            remote_timeout: Duration::from_secs(
                env.parse(
                    "TESSERA_REMOTE_TIMEOUT_S",
                    "whole seconds of at least 1",
                    |v| number(v).filter(|&n: &u64| n > 0),
                )
                .unwrap_or(60),
            ),
            reference_loader: env.path("TESSERA_REFERENCE_LOADER"),
            python: env.path("TESSERA_PYTHON"),
            bench_threads: env.parse(
                "TESSERA_BENCH_THREADS",
                "a thread count of at least 1",
                count,
            ),
            no_progress: (env.lookup)("NO_PROGRESS").is_some(),
            checkpoint_pause_at: env.parse("TESSERA_CHECKPOINT_PAUSE_AT", "a step number", number),
            remote_latency: Duration::from_millis(
                env.parse("TESSERA_REMOTE_LATENCY_MS", "whole milliseconds", number)
                    .unwrap_or(0),
            ),
        };
        (switches, env.first_error.into_inner())
    }
}

/// `1`/`0`, also `true`/`false`, `on`/`off`, `yes`/`no` in any case.
fn flag(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    }
}

fn number<T: std::str::FromStr>(v: &str) -> Option<T> {
    v.parse().ok()
}

fn count(v: &str) -> Option<usize> {
    number(v).filter(|&n| n > 0)
}

/// The lookup the switches are read through, and the first value it refused.
struct Env<F> {
    lookup: F,
    first_error: RefCell<Option<SwitchError>>,
}

impl<F: Fn(&str) -> Option<OsString>> Env<F> {
    /// `var`'s value through `parse` (given it trimmed); `None` when it is unset, or set to
    /// something `parse` refuses or that is not UTF-8 (then remembered as the error).
    fn parse<T>(
        &self,
        var: &'static str,
        expected: &'static str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Option<T> {
        let raw = (self.lookup)(var)?;
        let text = match raw.into_string() {
            Ok(text) => text,
            Err(raw) => return self.refuse(var, raw.to_string_lossy().into_owned(), expected),
        };
        match parse(text.trim()) {
            Some(value) => Some(value),
            None => self.refuse(var, text, expected),
        }
    }

    /// `var` as a path (any bytes but none at all).
    fn path(&self, var: &'static str) -> Option<PathBuf> {
        match (self.lookup)(var) {
            Some(raw) if raw.is_empty() => self.refuse(var, String::new(), "a path"),
            raw => raw.map(PathBuf::from),
        }
    }

    /// Remembers `var`'s refused value (the first one only) and gives the default's `None`.
    fn refuse<T>(&self, var: &'static str, value: String, expected: &'static str) -> Option<T> {
        self.first_error.borrow_mut().get_or_insert(SwitchError {
            var,
            value,
            expected,
        });
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn switches(vars: &[(&str, &str)]) -> Result<Switches, SwitchError> {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Switches::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn unset_variables_give_the_documented_defaults() -> Result<(), SwitchError> {
        let s = switches(&[])?;
        assert!(s.side_stream && !s.dense_attention && !s.no_progress);
        assert_eq!(s.cpu_bf16_gemm, None);
        assert_eq!(s.loader_threads, None);
        assert_eq!(s.gloo_host, None);
        assert_eq!(s.cache_dir, None);
        assert_eq!(s.remote_retry, Duration::from_secs(120));
        assert_eq!(s.remote_retries, 10);
        assert_eq!(s.remote_backoff, Duration::from_millis(100));
        assert_eq!(s.remote_timeout, Duration::from_secs(60));
        assert_eq!((s.reference_loader, s.python), (None, None));
        assert_eq!(s.bench_threads, None);
        assert_eq!(s.checkpoint_pause_at, None);
        assert_eq!(s.remote_latency, Duration::ZERO);
        Ok(())
    }

    #[test]
    fn every_variable_sets_its_field() -> Result<(), SwitchError> {
        let s = switches(&[
            ("TESSERA_SIDE_STREAM", "0"),
            ("TESSERA_CPU_BF16_GEMM", "f32"),
            ("TESSERA_DENSE_ATTENTION", "1"),
            ("TESSERA_LOADER_THREADS", " 3 "),
            ("TESSERA_GLOO_HOST", "10.0.0.2"),
            ("TESSERA_CACHE", "/tmp/cache"),
            ("TESSERA_REMOTE_RETRY_S", "3"),
            ("TESSERA_REMOTE_RETRIES", "4"),
            ("TESSERA_REMOTE_BACKOFF_MS", "10"),
            ("TESSERA_REMOTE_TIMEOUT_S", "2"),
            ("TESSERA_REFERENCE_LOADER", "ref.py"),
            ("TESSERA_PYTHON", "/usr/bin/python3"),
            ("TESSERA_BENCH_THREADS", "2"),
            ("NO_PROGRESS", ""),
            ("TESSERA_CHECKPOINT_PAUSE_AT", "8"),
            ("TESSERA_REMOTE_LATENCY_MS", "20"),
        ])?;
        assert!(!s.side_stream && s.dense_attention && s.no_progress);
        assert_eq!(s.cpu_bf16_gemm, Some(Bf16Gemm::F32));
        assert_eq!(s.loader_threads, Some(3));
        assert_eq!(s.gloo_host.as_deref(), Some("10.0.0.2"));
        assert_eq!(s.cache_dir, Some(PathBuf::from("/tmp/cache")));
        assert_eq!(s.remote_retry, Duration::from_secs(3));
        assert_eq!(s.remote_retries, 4);
        assert_eq!(s.remote_backoff, Duration::from_millis(10));
        assert_eq!(s.remote_timeout, Duration::from_secs(2));
        assert_eq!(s.reference_loader, Some(PathBuf::from("ref.py")));
        assert_eq!(s.python, Some(PathBuf::from("/usr/bin/python3")));
        assert_eq!(s.bench_threads, Some(2));
        assert_eq!(s.checkpoint_pause_at, Some(8));
        assert_eq!(s.remote_latency, Duration::from_millis(20));
        Ok(())
    }

    #[test]
    fn flags_take_the_usual_spellings() -> Result<(), SwitchError> {
        for (value, on) in [("1", true), ("TRUE", true), ("off", false), ("No", false)] {
            assert_eq!(
                switches(&[("TESSERA_DENSE_ATTENTION", value)])?.dense_attention,
                on
            );
        }
        Ok(())
    }

    #[test]
    fn a_bad_value_is_an_error_naming_the_variable_and_the_value() {
        for (var, value) in [
            ("TESSERA_SIDE_STREAM", "maybe"),
            ("TESSERA_CPU_BF16_GEMM", "bf16"),
            ("TESSERA_DENSE_ATTENTION", ""),
            ("TESSERA_LOADER_THREADS", "0"),
            ("TESSERA_LOADER_THREADS", "two"),
            ("TESSERA_GLOO_HOST", " "),
            ("TESSERA_CACHE", ""),
            ("TESSERA_REMOTE_RETRY_S", "-1"),
            ("TESSERA_REMOTE_RETRIES", "many"),
            ("TESSERA_REMOTE_TIMEOUT_S", "0"),
            ("TESSERA_BENCH_THREADS", "all"),
            ("TESSERA_CHECKPOINT_PAUSE_AT", "6.5"),
            ("TESSERA_REMOTE_LATENCY_MS", "20ms"),
        ] {
            let err = switches(&[(var, value)]).expect_err(var);
            assert_eq!((err.var, err.value.as_str()), (var, value));
            let shown = err.to_string();
            assert!(
                shown.starts_with(&format!("{var}={value:?}: expected ")),
                "{shown}"
            );
        }
    }

    #[test]
    fn get_keeps_the_default_of_a_refused_variable_and_the_values_of_the_others() {
        let env = |name: &str| match name {
            "TESSERA_LOADER_THREADS" => Some(OsString::from("two")),
            "TESSERA_REMOTE_RETRIES" => Some(OsString::from("3")),
            "TESSERA_BENCH_THREADS" => Some(OsString::from("all")),
            _ => None,
        };
        let (s, error) = Switches::lenient(env);
        assert_eq!(s.loader_threads, None);
        assert_eq!(s.bench_threads, None);
        assert_eq!(s.remote_retries, 3);
        let error = error.map(|e| (e.var, e.value));
        assert_eq!(error, Some(("TESSERA_LOADER_THREADS", "two".to_string())));
    }

    #[cfg(unix)]
    #[test]
    fn a_value_that_is_not_utf8_is_an_error_unless_it_is_a_path() -> Result<(), SwitchError> {
        use std::os::unix::ffi::OsStringExt;
        let bytes = || OsString::from_vec(vec![b'c', 0xff]);
        let err = Switches::from_lookup(|name| (name == "TESSERA_REMOTE_RETRY_S").then(bytes))
            .expect_err("not UTF-8");
        assert_eq!(
            (err.var, err.value.as_str()),
            ("TESSERA_REMOTE_RETRY_S", "c\u{fffd}")
        );
        let s = Switches::from_lookup(|name| (name == "TESSERA_CACHE").then(bytes))?;
        assert_eq!(s.cache_dir, Some(PathBuf::from(bytes())));
        Ok(())
    }
}
