//! A client of vgpud's admin API (HTTP/1.1 + JSON over a unix socket).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use thiserror::Error;

/// How long to wait for the daemon.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Why an API call failed.
#[derive(Debug, Error)]
pub enum ApiError {
    /// The socket could not be reached.
    #[error("cannot connect to vgpud at {path}: {source} ({})", connect_hint(.source))]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The exchange broke.
    #[error("talking to vgpud failed")]
    Io(#[from] std::io::Error),
    /// The daemon answered something that is not HTTP + JSON.
    #[error("vgpud sent a malformed response: {0}")]
    Malformed(String),
    /// The daemon refused the request.
    #[error("{message}")]
    Status {
        /// HTTP status.
        status: u16,
        /// The daemon's message.
        message: String,
    },
}

fn connect_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => {
            "the admin socket is for root and vgpud's user only: run vgpuctl with sudo or as that user"
        }
        std::io::ErrorKind::NotFound => {
            "is vgpud running? is --socket (or VGPU_ADMIN_SOCKET) the [admin] socket of its config?"
        }
        _ => "is vgpud running? is --socket right? do you have permission?",
    }
}

/// An admin API client.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

impl Client {
    /// A client of the daemon at `socket`.
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_path_buf(),
        }
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends a request and returns the JSON body of a 2xx response.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ApiError> {
        let (status, text) = self.exchange(method, path, body)?;
        let json: Value =
            serde_json::from_str(&text).map_err(|e| ApiError::Malformed(e.to_string()))?;
        if (200..300).contains(&status) {
            Ok(json)
        } else {
            let message = json["error"]
                .as_str()
                .unwrap_or("request failed")
                .to_string();
            Err(ApiError::Status { status, message })
        }
    }

    /// GET of a text resource (e.g. `/v1/metrics`).
    pub fn get_text(&self, path: &str) -> Result<String, ApiError> {
        let (status, text) = self.exchange("GET", path, None)?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|j| j["error"].as_str().map(str::to_string))
            .unwrap_or_else(|| "request failed".into());
        Err(ApiError::Status { status, message })
    }

    /// POST with a JSON body.
    pub fn post(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.request("POST", path, Some(body))
    }

    /// PATCH with a JSON body.
    pub fn patch(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.request("PATCH", path, Some(body))
    }

    /// DELETE.
    pub fn delete(&self, path: &str) -> Result<Value, ApiError> {
        self.request("DELETE", path, None)
    }

    /// One HTTP exchange: the status and the body text.
    fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, String), ApiError> {
        let mut s = UnixStream::connect(&self.socket).map_err(|source| ApiError::Connect {
            path: self.socket.clone(),
            source,
        })?;
        s.set_read_timeout(Some(TIMEOUT))?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: vgpud\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp)?;
        let text = String::from_utf8_lossy(&resp);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| ApiError::Malformed("no header terminator".into()))?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ApiError::Malformed(head.lines().next().unwrap_or("").to_string()))?;
        Ok((status, body.to_string()))
    }

    /// GET.
    pub fn get(&self, path: &str) -> Result<Value, ApiError> {
        self.request("GET", path, None)
    }
}
