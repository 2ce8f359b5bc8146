//! The requests and responses the admin API (unix socket) and the metrics endpoint (TCP)
//! handle; [`crate::server`] carries them over HTTP/1.1.

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
    /// The content type and the body's bytes (JSON pretty-printed), ending with a newline.
    pub fn encode(&self) -> (&'static str, Vec<u8>) {
        let (ctype, mut body) = match &self.body {
            Body::Json(v) => (
                "application/json",
                serde_json::to_vec_pretty(v).unwrap_or_default(),
            ),
            Body::Text(t, s) => (*t, s.as_bytes().to_vec()),
        };
        if !body.ends_with(b"\n") {
            body.push(b'\n');
        }
        (ctype, body)
    }

    /// The JSON body (Null for text).
    pub fn json_body(&self) -> &Value {
        match &self.body {
            Body::Json(v) => v,
            Body::Text(..) => &Value::Null,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_encoded_with_their_content_type_and_a_final_newline() {
        let (t, b) = HttpResponse::error(404, "nope").encode();
        assert_eq!(t, "application/json");
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["error"], "nope");
        assert!(b.ends_with(b"\n"));
        let (t, b) = HttpResponse::text(200, "text/plain", "a 1".into()).encode();
        assert_eq!((t, b.as_slice()), ("text/plain", &b"a 1\n"[..]));
        let r = HttpResponse::not_allowed("PUT", "/v1/info", "GET");
        assert_eq!((r.status, r.allow), (405, Some("GET")));
    }
}
