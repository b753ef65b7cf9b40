//! CORS as llama-server answers it: preflight requests get the allowed methods and headers
//! without needing the API key, and every response names the allowed origin. `--cors-origins`
//! is `*` (any origin, reflected so credentials work), `localhost` (only pages served from
//! this machine: `localhost`, `127.0.0.1`, `[::1]`) or a comma-separated list; when it is not
//! given, `*`, or `localhost` when agent tools or MCP servers are on (a page from anywhere
//! could otherwise drive them).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// Answers preflights and marks responses with the origin they may be read from.
pub async fn layer(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    answer(&st.config.args, req, next).await
}

/// [`layer`]'s work under the options `args`.
pub(crate) async fn answer(args: &crate::Args, req: Request, next: Next) -> Response {
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_owned);
    let preflight = req.method() == Method::OPTIONS;
    let mut resp = if preflight {
        StatusCode::OK.into_response()
    } else {
        next.run(req).await
    };
    let allowed = origin.filter(|o| allows(rule(args), o));
    let headers = resp.headers_mut();
    if let Some(value) = allowed.and_then(|o| HeaderValue::from_str(&o).ok()) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
        headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    if preflight {
        for (name, value) in [
            (header::ACCESS_CONTROL_ALLOW_METHODS, &args.cors_methods),
            (header::ACCESS_CONTROL_ALLOW_HEADERS, &args.cors_headers),
        ] {
            if let Ok(v) = HeaderValue::from_str(value) {
                headers.insert(name, v);
            }
        }
    }
    resp
}

/// The origins `--cors-origins` allows, or its default.
fn rule(args: &crate::Args) -> &str {
    match &args.cors_origins {
        Some(rule) => rule,
        None if args.tools.enabled() => "localhost",
        None => "*",
    }
}

/// Whether `--cors-origins` `rule` allows `origin`.
pub fn allows(rule: &str, origin: &str) -> bool {
    match rule.trim() {
        "*" => true,
        "localhost" => is_local(origin),
        list => list.split(',').any(|o| o.trim() == origin),
    }
}

/// `http(s)://` and a loopback host, with or without a port, and nothing after.
fn is_local(origin: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let host = if let Some(v6) = rest.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, port)) if port.is_empty() || is_port(port) => return h == "::1",
            _ => return false,
        }
    } else {
        match rest.split_once(':') {
            Some((h, port)) if is_port(port) => h,
            Some(_) => return false,
            None => rest,
        }
    };
    host == "localhost" || host == "127.0.0.1"
}

fn is_port(s: &str) -> bool {
    s.strip_prefix(':').unwrap_or(s).parse::<u16>().is_ok() && !s.trim_start_matches(':').is_empty()
}

#[cfg(test)]
mod tests {
    use super::allows;

    #[test]
    fn localhost_allows_loopback_pages_only() {
        for ok in [
            "http://localhost",
            "http://localhost:8080",
            "http://127.0.0.1:3000",
            "https://[::1]",
            "http://[::1]:3000",
        ] {
            assert!(allows("localhost", ok), "{ok}");
        }
        for bad in [
            "http://evil.com",
            "http://notlocalhost",
            "http://localhost.evil.com",
            "http://localhost:80/x",
            "localhost",
        ] {
            assert!(!allows("localhost", bad), "{bad}");
        }
        assert!(allows("*", "anything"));
        assert!(allows("http://a, http://b", "http://b"));
        assert!(!allows("http://a", "http://b"));
    }
}
