//! A client of vgpud's admin API (HTTP/1.1 + JSON over a unix socket).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use thiserror::Error;
use vgpu_api::ApiErrorBody;

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

/// The message of an error response (`{"error": "…"}`).
fn error_message(text: &str) -> String {
    serde_json::from_str::<ApiErrorBody>(text).map_or_else(|_| "request failed".into(), |e| e.error)
}

/// A request body as JSON.
fn to_body<B: Serialize + ?Sized>(body: &B) -> Result<Value, ApiError> {
    serde_json::to_value(body).map_err(|e| ApiError::Malformed(format!("request body: {e}")))
}

/// A response read as its `vgpu_api` type. The JSON itself is what `--json` prints (it keeps
/// fields a newer vgpud adds); the type is what vgpuctl's tables read.
pub fn typed<T: DeserializeOwned>(v: &Value) -> Result<T, ApiError> {
    T::deserialize(v).map_err(|e| {
        ApiError::Malformed(format!(
            "the response does not have the shape vgpuctl knows ({e}); are vgpud and vgpuctl the same version?"
        ))
    })
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
            Err(ApiError::Status {
                status,
                message: error_message(&text),
            })
        }
    }

    /// GET of a text resource (e.g. `/v1/metrics`).
    pub fn get_text(&self, path: &str) -> Result<String, ApiError> {
        let (status, text) = self.exchange("GET", path, None)?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        Err(ApiError::Status {
            status,
            message: error_message(&text),
        })
    }

    /// POST with a JSON body (a `vgpu_api` request type, or any JSON).
    pub fn post<B: Serialize + ?Sized>(&self, path: &str, body: &B) -> Result<Value, ApiError> {
        self.request("POST", path, Some(&to_body(body)?))
    }

    /// PATCH with a JSON body (a `vgpu_api` request type, or any JSON).
    pub fn patch<B: Serialize + ?Sized>(&self, path: &str, body: &B) -> Result<Value, ApiError> {
        self.request("PATCH", path, Some(&to_body(body)?))
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
