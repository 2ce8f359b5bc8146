//! The state file: which devices `vgpuctl passthrough bind` moved to
//! vfio-pci and what they were bound to before, so `unbind` restores it.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use vgpu_pci::PciAddress;

/// Default directory of the state file.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/vgpu";
/// Name of the state file in its directory.
pub const STATE_FILE: &str = "passthrough.json";
/// Version of the file's format.
pub const STATE_VERSION: u32 = 1;

/// Why the state file could not be used.
#[derive(Debug, Error)]
pub enum StateError {
    /// Reading or writing failed.
    #[error(
        "cannot {action} the passthrough state file {}: {source} (run as root, or choose another directory with --state-dir)",
        path.display()
    )]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The file is not what vgpuctl writes.
    #[error(
        "the passthrough state file {} is damaged ({reason}); fix or remove it (it only records the drivers devices had before `bind`)",
        path.display()
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// What a device was bound to before `bind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// Its driver then (None: no driver).
    pub original_driver: Option<String>,
    /// Its `driver_override` then.
    pub original_override: Option<String>,
    /// The device the user named when this one was bound with `--group`.
    pub bound_with: Option<String>,
    /// When it was bound (seconds since the Unix epoch).
    pub bound_at: u64,
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Format version.
    pub version: u32,
    /// Bindings by PCI address.
    pub devices: BTreeMap<String, Binding>,
}

impl Default for State {
    fn default() -> Self {
        Self {
            version: STATE_VERSION,
            devices: BTreeMap::new(),
        }
    }
}

impl State {
    /// The record of a device.
    pub fn binding(&self, a: PciAddress) -> Option<&Binding> {
        self.devices.get(&a.to_string())
    }

    /// Devices bound together with `a` (`--group`), `a` first when recorded.
    pub fn bound_with(&self, a: PciAddress) -> Vec<PciAddress> {
        let key = a.to_string();
        self.devices
            .iter()
            .filter(|(k, b)| **k == key || b.bound_with.as_deref() == Some(key.as_str()))
            .filter_map(|(k, _)| k.parse().ok())
            .collect()
    }
}

/// Where the state file lives.
#[derive(Debug, Clone)]
pub struct StateStore {
    path: PathBuf,
}

impl StateStore {
    /// The state file in `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            path: dir.join(STATE_FILE),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file (an empty state when it does not exist).
    pub fn load(&self) -> Result<State, StateError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(State::default()),
            Err(source) => {
                return Err(StateError::Io {
                    action: "read",
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let state: State = serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        if state.version != STATE_VERSION {
            return Err(StateError::Corrupt {
                path: self.path.clone(),
                reason: format!(
                    "format version {} where this vgpuctl writes {STATE_VERSION}",
                    state.version
                ),
            });
        }
        if let Some(k) = state
            .devices
            .keys()
            .find(|k| k.parse::<PciAddress>().is_err())
        {
            return Err(StateError::Corrupt {
                path: self.path.clone(),
                reason: format!("`{k}` is not a PCI address"),
            });
        }
        Ok(state)
    }

    /// Writes the file atomically (a temporary file renamed over it).
    pub fn save(&self, state: &State) -> Result<(), StateError> {
        let io_err = |source| StateError::Io {
            action: "write",
            path: self.path.clone(),
            source,
        };
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(io_err)?;
        }
        let tmp = self.path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(state).unwrap_or_default() + "\n";
        std::fs::write(&tmp, text).map_err(io_err)?;
        std::fs::rename(&tmp, &self.path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io_err(e)
        })
    }
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_damage_is_reported_with_the_file() {
        let d = tempfile::tempdir().unwrap();
        let store = StateStore::new(&d.path().join("sub"));
        assert_eq!(store.load().unwrap(), State::default());
        let mut st = State::default();
        let gpu: PciAddress = "0000:65:00.0".parse().unwrap();
        let audio: PciAddress = "0000:65:00.1".parse().unwrap();
        st.devices.insert(
            gpu.to_string(),
            Binding {
                original_driver: Some("nvidia".into()),
                original_override: None,
                bound_with: None,
                bound_at: 1,
            },
        );
        st.devices.insert(
            audio.to_string(),
            Binding {
                original_driver: Some("snd_hda_intel".into()),
                original_override: None,
                bound_with: Some(gpu.to_string()),
                bound_at: 1,
            },
        );
        store.save(&st).unwrap();
        assert_eq!(store.load().unwrap(), st);
        assert_eq!(st.bound_with(gpu), vec![gpu, audio]);
        assert_eq!(st.bound_with(audio), vec![audio]);

        std::fs::write(store.path(), "{\"version\": 1, \"devices\": {\"x\": ").unwrap();
        let e = store.load().unwrap_err().to_string();
        assert!(
            e.contains("damaged") && e.contains("passthrough.json"),
            "{e}"
        );
        std::fs::write(store.path(), "{\"version\": 9, \"devices\": {}}").unwrap();
        assert!(store.load().unwrap_err().to_string().contains("version 9"));
    }
}
