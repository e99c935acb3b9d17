//! `tessera train --profile N`: libtorch's Kineto profiler (the one `torch.profiler` drives)
//! records the first N optimizer steps of a run on each rank, saved as a Chrome trace
//! (`profile_rank{r}.json` in the run directory: chrome://tracing, Perfetto, TensorBoard).
//! Reached through `csrc/profiler_shim.cpp`; tch has no binding.
use crate::error::TrainError;
use std::ffi::{c_char, c_int, CString};
use std::path::Path;
use tessera_sys::profiler::{tc_profiler_start, tc_profiler_stop};

/// Turns a shim error into a `TrainError` naming `op` (and the trace's `path`), freeing it.
///
/// # Safety
/// `err` is null or a string one of the shim's functions returned, not yet freed.
unsafe fn check(err: *mut c_char, op: &'static str, path: Option<&Path>) -> Result<(), TrainError> {
    // SAFETY: the caller's contract.
    unsafe { tessera_sys::take_error(err, op) }.map_err(|source| TrainError::Profiler {
        path: path.map(Path::to_path_buf),
        source,
    })
}

/// The profiler while it records; [`Profiler::save`] stops it. Dropped unsaved (a step
/// failed), it stops without keeping the trace.
pub(crate) struct Profiler {
    recording: bool,
}

impl Profiler {
    /// Starts recording this thread's ops (and CUDA kernels and copies with `cuda`).
    pub(crate) fn start(cuda: bool) -> Result<Self, TrainError> {
        // SAFETY: no arguments to keep alive; the result is checked and freed.
        unsafe { check(tc_profiler_start(c_int::from(cuda)), "start", None)? };
        Ok(Profiler { recording: true })
    }

    /// Stops recording and writes the Chrome trace to `path`.
    pub(crate) fn save(mut self, path: &Path) -> Result<(), TrainError> {
        self.recording = false;
        let c_path = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| {
            TrainError::Invalid(format!(
                "profiler trace {}: the path holds a NUL",
                path.display()
            ))
        })?;
        // SAFETY: `c_path` outlives the call; the result is checked and freed.
        unsafe {
            check(
                tc_profiler_stop(c_path.as_ptr()),
                "stop and save",
                Some(path),
            )
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if self.recording {
            // SAFETY: as in `save`; the trace goes nowhere, an error is only logged.
            let err = unsafe { tc_profiler_stop(c"/dev/null".as_ptr()) };
            if let Err(e) = unsafe { check(err, "stop", None) } {
                tracing::warn!("stopping the profiler: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The saved trace is Chrome-trace JSON holding the ops run while recording.
    #[test]
    fn saved_trace_is_chrome_json_with_the_recorded_ops() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = std::env::temp_dir().join(format!("tessera_profile_{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("trace.json");
        let profiler = Profiler::start(false)?;
        let a = tch::Tensor::ones([64, 64], (tch::Kind::Float, tch::Device::Cpu));
        let _ = a.matmul(&a).sum(tch::Kind::Float);
        profiler.save(&path)?;
        let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
        std::fs::remove_dir_all(&dir)?;
        let events = trace["traceEvents"]
            .as_array()
            .ok_or("no traceEvents array")?;
        let names: Vec<&str> = events.iter().filter_map(|e| e["name"].as_str()).collect();
        assert!(
            names
                .iter()
                .any(|n| n.contains("matmul") || n.contains("mm")),
            "no matmul among the {} recorded events: {:?}",
            names.len(),
            &names[..names.len().min(20)]
        );
        Ok(())
    }
}
