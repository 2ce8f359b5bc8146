//! A small blocking client of vgpud's admin API (REST/JSON over HTTP/1.1 on
//! a unix socket; docs/admin-api.yaml). The plugin reads and writes the
//! bodies as the `vgpu-api` types vgpud serializes them from, so a field
//! renamed in vgpud is a compile error here, not a slot that silently
//! disappears.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;
use thiserror::Error;
use vgpu_api::{PassthroughAssignment, Profile, Removal, Vm, VmEntry};

/// Why an admin request failed.
#[derive(Debug, Error)]
pub enum AdminError {
    /// vgpud is not reachable.
    #[error(
        "cannot reach vgpud's admin API at {path}: {source}; is vgpud running with [admin] socket set?"
    )]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The reply is not HTTP with a JSON body.
    #[error("vgpud sent a reply that is not HTTP/JSON: {0}")]
    Reply(String),
    /// The reply is JSON, but not of the shape of its `vgpu-api` type.
    #[error(
        "vgpud's answer to {path} does not have the shape this plugin knows; are vgpud and the plugin the same version?"
    )]
    Shape {
        /// The request path.
        path: String,
        /// What did not match.
        #[source]
        source: serde_json::Error,
    },
    /// A request body cannot be encoded.
    #[error("cannot encode the body of {path}")]
    Encode {
        /// The request path.
        path: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// vgpud refused the request.
    #[error("vgpud answered {status}: {message}")]
    Status {
        /// HTTP status.
        status: u16,
        /// vgpud's message.
        message: String,
    },
}

/// The admin API of one vgpud.
#[derive(Debug, Clone)]
pub struct AdminClient {
    socket: PathBuf,
}

impl AdminClient {
    /// A client of the admin socket at `socket`.
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_path_buf(),
        }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// One request; the JSON body of a 2xx reply.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, AdminError> {
        let connect = |source| AdminError::Connect {
            path: self.socket.clone(),
            source,
        };
        let mut s = UnixStream::connect(&self.socket).map_err(connect)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(connect)?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: vgpud\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .map_err(connect)?;
        let mut reply = Vec::new();
        s.read_to_end(&mut reply).map_err(connect)?;
        let text = String::from_utf8_lossy(&reply);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| AdminError::Reply(text.chars().take(200).collect()))?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| AdminError::Reply(head.to_string()))?;
        let json: Value = if body.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(body).map_err(|e| AdminError::Reply(format!("{e}: {body}")))?
        };
        if (200..300).contains(&status) {
            Ok(json)
        } else {
            Err(AdminError::Status {
                status,
                message: json["error"].as_str().unwrap_or(body).to_string(),
            })
        }
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> Result<Value, AdminError> {
        self.request("GET", path, None)
    }

    /// One request whose 2xx reply is read as `T`.
    fn typed<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, AdminError> {
        let reply = self.request(method, path, body)?;
        T::deserialize(reply).map_err(|source| AdminError::Shape {
            path: path.to_string(),
            source,
        })
    }

    /// `GET /v1/profiles`.
    pub fn profiles(&self) -> Result<Vec<Profile>, AdminError> {
        self.typed("GET", "/v1/profiles", None)
    }

    /// `GET /v1/vms`.
    pub fn vms(&self) -> Result<Vec<Vm>, AdminError> {
        self.typed("GET", "/v1/vms", None)
    }

    /// `GET /v1/passthrough`.
    pub fn passthrough(&self) -> Result<Vec<PassthroughAssignment>, AdminError> {
        self.typed("GET", "/v1/passthrough", None)
    }

    /// `POST /v1/vms`: creates a VM; vgpud's view of it.
    pub fn create_vm(&self, entry: &VmEntry) -> Result<Vm, AdminError> {
        const PATH: &str = "/v1/vms";
        let body = serde_json::to_value(entry).map_err(|source| AdminError::Encode {
            path: PATH.to_string(),
            source,
        })?;
        self.typed("POST", PATH, Some(&body))
    }

    /// `DELETE /v1/vms/{name}`: what was released.
    pub fn remove_vm(&self, name: &str) -> Result<Removal, AdminError> {
        self.typed("DELETE", &format!("/v1/vms/{name}"), None)
    }
}
