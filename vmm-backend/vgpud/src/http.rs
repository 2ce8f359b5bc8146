//! The small HTTP/1.1 layer the admin API (unix socket) and the metrics endpoint (TCP) share:
//! one request per connection, bounded head and body.

use std::io::{self, BufRead, BufReader, Read, Write};

use serde_json::{Value, json};

/// Longest request head accepted.
pub const MAX_HEAD: usize = 16 << 10;
/// Largest request body accepted.
pub const MAX_BODY: usize = 1 << 20;

/// A parsed request.
#[derive(Debug)]
pub struct HttpRequest {
    /// `GET`, `POST`, …
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// A response body.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// JSON.
    Json(Value),
    /// Text with a content type.
    Text(&'static str, String),
}

/// A response.
#[derive(Debug)]
pub struct HttpResponse {
    /// HTTP status.
    pub status: u16,
    /// Body.
    pub body: Body,
    /// Methods allowed on the path (a 405's `Allow` header).
    pub allow: Option<&'static str>,
}

impl HttpResponse {
    /// 200 with a JSON body.
    pub fn ok(body: Value) -> Self {
        Self::json(200, body)
    }
    /// A JSON body with a status.
    pub fn json(status: u16, body: Value) -> Self {
        Self {
            status,
            body: Body::Json(body),
            allow: None,
        }
    }
    /// A text body.
    pub fn text(status: u16, content_type: &'static str, text: String) -> Self {
        Self {
            status,
            body: Body::Text(content_type, text),
            allow: None,
        }
    }
    /// `{"error": message}` with a status.
    pub fn error(status: u16, message: impl Into<String>) -> Self {
        Self::json(status, json!({ "error": message.into() }))
    }
    pub(crate) fn not_allowed(method: &str, path: &str, allow: &'static str) -> Self {
        Self {
            allow: Some(allow),
            ..Self::error(
                405,
                format!("{method} is not allowed on {path}; allowed: {allow}"),
            )
        }
    }
    /// The JSON body (Null for text).
    pub fn json_body(&self) -> &Value {
        match &self.body {
            Body::Json(v) => v,
            Body::Text(..) => &Value::Null,
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Payload Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// Reads one HTTP/1.1 request.
pub fn read_request<R: Read>(r: R) -> Result<HttpRequest, HttpResponse> {
    let mut r = BufReader::new(r.take((MAX_HEAD + MAX_BODY) as u64));
    let mut head_len = 0;
    let mut line = String::new();
    let mut next_line = |r: &mut BufReader<_>, line: &mut String| -> Result<(), HttpResponse> {
        line.clear();
        let n = r
            .read_line(line)
            .map_err(|_| HttpResponse::error(400, "unreadable request"))?;
        head_len += n;
        if n == 0 || head_len > MAX_HEAD {
            return Err(HttpResponse::error(
                400,
                "incomplete or oversized request head",
            ));
        }
        Ok(())
    };
    next_line(&mut r, &mut line)?;
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(HttpResponse::error(400, "malformed request line"));
    };
    let method = method.to_string();
    let path = target.split('?').next().unwrap_or("").to_string();
    let mut content_length = 0usize;
    loop {
        next_line(&mut r, &mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.trim().eq_ignore_ascii_case("content-length")
        {
            content_length = v
                .trim()
                .parse()
                .map_err(|_| HttpResponse::error(400, "bad Content-Length"))?;
        }
    }
    if content_length > MAX_BODY {
        return Err(HttpResponse::error(413, "request body too large"));
    }
    let mut body = vec![0; content_length];
    r.read_exact(&mut body)
        .map_err(|_| HttpResponse::error(400, "request body shorter than Content-Length"))?;
    Ok(HttpRequest { method, path, body })
}

/// Writes a response and closes the exchange.
pub fn write_response<W: Write>(mut w: W, resp: &HttpResponse) -> io::Result<()> {
    let (ctype, mut body) = match &resp.body {
        Body::Json(v) => (
            "application/json",
            serde_json::to_vec_pretty(v).unwrap_or_default(),
        ),
        Body::Text(t, s) => (*t, s.as_bytes().to_vec()),
    };
    if !body.ends_with(b"\n") {
        body.push(b'\n');
    }
    let allow = resp
        .allow
        .map(|a| format!("Allow: {a}\r\n"))
        .unwrap_or_default();
    write!(
        w,
        "HTTP/1.1 {} {}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        resp.status,
        reason(resp.status),
        body.len()
    )?;
    w.write_all(&body)?;
    w.flush()
}
