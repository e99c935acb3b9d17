//! Rendezvous: c10d's TCPStore (rank 0 hosts it) and the torchrun environment (RANK,
//! WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) that both `torchrun` and
//! `tessera train --nproc N` set for every rank.
use super::ffi;
use super::DistError;
use std::ffi::CString;
use std::time::Duration;

/// Where this process sits in the job, as torchrun describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    /// Ranks on this machine (LOCAL_WORLD_SIZE; the whole job when unset).
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
}

impl RankEnv {
    /// Reads the torchrun variables. `Ok(None)` when WORLD_SIZE is unset (a plain single-process
    /// run); an error names the variable that is missing or malformed.
    pub fn from_env() -> Result<Option<RankEnv>, DistError> {
        Self::from_lookup(|key| std::env::var(key).ok())
    }

    /// Same as `from_env` over any key lookup (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<RankEnv>, DistError> {
        let Some(world) = get("WORLD_SIZE") else {
            return Ok(None);
        };
        let number = |key: &str, raw: Option<String>| -> Result<usize, DistError> {
            let raw = raw.ok_or_else(|| DistError::Env {
                var: key.to_string(),
                message: "is not set although WORLD_SIZE is".into(),
            })?;
            raw.trim().parse::<usize>().map_err(|_| DistError::Env {
                var: key.to_string(),
                message: format!("{raw:?} is not a non-negative integer"),
            })
        };
        let world_size = number("WORLD_SIZE", Some(world))?;
        let rank = number("RANK", get("RANK"))?;
        let local_rank = match get("LOCAL_RANK") {
            Some(v) => number("LOCAL_RANK", Some(v))?,
            None => rank,
        };
        let local_world_size = match get("LOCAL_WORLD_SIZE") {
            Some(v) => number("LOCAL_WORLD_SIZE", Some(v))?,
            None => world_size,
        };
        let master_addr = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".to_string());
        let port = number("MASTER_PORT", get("MASTER_PORT"))?;
        let master_port = u16::try_from(port).map_err(|_| DistError::Env {
            var: "MASTER_PORT".into(),
            message: format!("{port} is not a TCP port"),
        })?;
        if world_size == 0 || rank >= world_size {
            return Err(DistError::Env {
                var: "RANK".into(),
                message: format!("rank {rank} is outside world size {world_size}"),
            });
        }
        Ok(Some(RankEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
        }))
    }
}

/// A client of the job's TCPStore (rank 0 also hosts the server), under a key prefix so several
/// process groups can share one store.
pub struct Store {
    pub(crate) raw: *mut ffi::RawStore,
    host: String,
    port: u16,
}

// SAFETY: c10d stores are internally synchronised and used from any thread by PyTorch.
unsafe impl Send for Store {}
unsafe impl Sync for Store {}

impl Store {
    /// Connects to (or, when `is_server`, hosts) the store at host:port. Port 0 on the server
    /// binds a free port; `port()` then tells which.
    pub fn connect(
        host: &str,
        port: u16,
        is_server: bool,
        world_size: usize,
        timeout: Duration,
        prefix: &str,
    ) -> Result<Store, DistError> {
        let store_err = |message: String| DistError::Store {
            host: host.to_string(),
            port,
            message,
        };
        let c_host =
            CString::new(host).map_err(|_| store_err("host contains a NUL byte".into()))?;
        let c_prefix =
            CString::new(prefix).map_err(|_| store_err("prefix contains a NUL byte".into()))?;
        let world =
            i32::try_from(world_size).map_err(|_| store_err("world size too large".into()))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid NUL-terminated strings and an out pointer; the shim catches exceptions.
        let err = unsafe {
            ffi::tc_store_new(
                c_host.as_ptr(),
                port,
                i32::from(is_server),
                world,
                millis(timeout),
                c_prefix.as_ptr(),
                &mut raw,
            )
        };
        // SAFETY: `err` is what the shim just returned.
        unsafe { tessera_sys::take_error(err, "store connect") }
            .map_err(|e| store_err(e.message))?;
        // SAFETY: raw is a live store on success.
        let port = unsafe { ffi::tc_store_port(raw) };
        Ok(Store {
            raw,
            host: host.to_string(),
            port,
        })
    }

    /// Host the store was reached at.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The store's TCP port (the bound one when the server was asked for port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    fn err(&self, what: &str, message: String) -> DistError {
        DistError::Store {
            host: self.host.clone(),
            port: self.port,
            message: format!("{what}: {message}"),
        }
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), DistError> {
        let c_key = CString::new(key).map_err(|_| self.err(key, "key holds a NUL".into()))?;
        let len = i64::try_from(value.len()).map_err(|_| self.err(key, "value too long".into()))?;
        // SAFETY: `raw` is live; key and value outlive the call, which copies them.
        let err = unsafe { ffi::tc_store_set(self.raw, c_key.as_ptr(), value.as_ptr(), len) };
        // SAFETY: `err` is what the shim just returned.
        unsafe { tessera_sys::take_error(err, "store set") }
            .map_err(|e| self.err(&format!("set {key}"), e.message))
    }

    /// `key`'s value (its first 64 bytes at most), or `None` while no rank has set it. Does not
    /// wait for the key.
    pub fn get_if_set(&self, key: &str) -> Result<Option<Vec<u8>>, DistError> {
        let c_key = CString::new(key).map_err(|_| self.err(key, "key holds a NUL".into()))?;
        let mut buf = [0u8; 64];
        let mut len = -1i64;
        // SAFETY: `raw` is live; `buf` holds `cap` bytes and `len` is a valid out pointer.
        let err = unsafe {
            ffi::tc_store_get_if_set(
                self.raw,
                c_key.as_ptr(),
                buf.as_mut_ptr(),
                buf.len() as i64,
                &mut len,
            )
        };
        // SAFETY: `err` is what the shim just returned.
        unsafe { tessera_sys::take_error(err, "store get") }
            .map_err(|e| self.err(&format!("get {key}"), e.message))?;
        Ok(usize::try_from(len)
            .ok()
            .map(|n| buf[..n.min(buf.len())].to_vec()))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: raw came from tc_store_new and is freed once.
        unsafe { ffi::tc_store_free(self.raw) };
    }
}

/// Milliseconds for the shim, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
