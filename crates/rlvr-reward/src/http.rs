//! The HTTP side shared by the verifiers that ask a server ([`crate::judge`],
//! [`crate::reward_model`]): one JSON POST with a body limit, the retry policy (a timeout, a
//! transport error, an HTTP 5xx, 429 or 408 or a malformed answer is retried, waiting 0.1 s · 2^i,
//! or the server's `Retry-After` in seconds when longer, capped at the request's `timeout_s`; any
//! other HTTP 4xx fails at once), and a bounded pool of requests in flight.
//!
//! Redirects are never followed (issue 49): a client following a 302 re-sends a POST as a
//! body-less GET and would use that answer, so an HTTP 3xx fails at once naming the URL and the
//! `Location` it pointed to.

use crate::truncate;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Most bytes read from one answer.
const BODY_LIMIT: u64 = 1 << 20;

/// Why one attempt failed.
pub(crate) enum Failure {
    /// Worth another attempt: a timeout, a transport error, HTTP 5xx, or an answer that is not
    /// what the route promises.
    Retry(String),
    /// Worth another attempt after at least this wait: the server said so (`Retry-After` with
    /// HTTP 429, 408 or 5xx), already capped at the request's timeout.
    RetryAfter(String, Duration),
    /// HTTP 4xx other than 408 and 429, or a 3xx: the server refused the request (or sent it
    /// elsewhere); another attempt would get the same.
    Refused(String),
}

/// A plain-HTTP client with a per-request timeout, answering every status (no status is an
/// error of the transport) and following no redirect (a 3xx comes back as it is). It keeps up to
/// `in_flight` idle connections to the server, so the pool of requests in flight reuses its
/// connections instead of opening one per request (ureq keeps 3 per host by default: with more
/// requests in flight every other request opened a connection, and a long run left thousands of
/// sockets in TIME_WAIT, issue 49 item 16).
pub(crate) fn agent(timeout: Duration, in_flight: usize) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(timeout))
        .max_idle_connections(in_flight.max(1))
        .max_idle_connections_per_host(in_flight.max(1))
        .build();
    ureq::Agent::new_with_config(config)
}

/// `url` with the user-information part (`user:password@`) replaced by `***@`, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// Checks a server URL: plain `http://` and no credentials in it (they would be written to
/// config.toml, train.log, TensorBoard and every error message; `api_key_env` sends a key as a
/// bearer token instead). The error does not repeat the credentials.
pub(crate) fn check_server(server: &str) -> Result<(), String> {
    let base = server.trim_end_matches('/');
    if !base.starts_with("http://") {
        return Err("server: expected http://host:port (plain HTTP only)".into());
    }
    if redact(base) != base {
        return Err(
            "server: the URL carries credentials (user:password@), which would be written to \
             config.toml, train.log and every error message; put the key in an environment \
             variable and name it in api_key_env (sent as `Authorization: Bearer KEY`)"
                .into(),
        );
    }
    Ok(())
}

/// The API key of a server from the environment variable `api_key_env` names (`None` when no
/// variable is named). `owner` names the setting in the error (`judge`, `reward model`).
///
/// # Errors
/// The variable is not set or is empty; the message names the variable, never a value.
pub(crate) fn api_key(owner: &str, api_key_env: Option<&str>) -> Result<Option<String>, String> {
    let Some(var) = api_key_env else {
        return Ok(None);
    };
    match std::env::var(var) {
        Ok(k) if !k.is_empty() => Ok(Some(k)),
        _ => Err(format!(
            "{owner}: api_key_env = {var:?}, but the environment variable {var} is not set (or is \
             empty)"
        )),
    }
}

/// The wait a `Retry-After` header value asks for, in its seconds form (the HTTP-date form is
/// not read: the usual back-off applies), capped at `cap`.
pub(crate) fn retry_after(value: Option<&str>, cap: Duration) -> Option<Duration> {
    let secs: u64 = value?.trim().parse().ok()?;
    Some(Duration::from_secs(secs).min(cap))
}

/// One POST of `body` to `url` (with `Authorization: Bearer KEY` when `api_key` is given): the
/// answer's JSON when the status is 200.
pub(crate) fn post_json(
    agent: &ureq::Agent,
    url: &str,
    api_key: Option<&str>,
    body: &Value,
    timeout_s: f64,
) -> Result<Value, Failure> {
    let mut req = agent.post(url);
    if let Some(k) = api_key {
        req = req.header("Authorization", &format!("Bearer {k}"));
    }
    let mut resp = match req.send_json(body) {
        Ok(r) => r,
        Err(ureq::Error::Timeout(_)) => {
            return Err(Failure::Retry(format!(
                "no answer within {timeout_s:.1} s (timeout_s)"
            )))
        }
        Err(e) => return Err(Failure::Retry(format!("transport error: {e}"))),
    };
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    if (300..400).contains(&status) {
        return Err(Failure::Refused(format!(
            "answered HTTP {status} redirecting {url} to {}: a POST API is not redirected (the \
             request would be re-sent as a body-less GET); set the server's URL to the address \
             that answers",
            header("location").unwrap_or_else(|| "(no Location header)".into())
        )));
    }
    let wait = retry_after(
        header("retry-after").as_deref(),
        Duration::from_secs_f64(timeout_s.max(0.0)),
    );
    let text = resp
        .body_mut()
        .with_config()
        .limit(BODY_LIMIT)
        .read_to_string()
        .map_err(|e| Failure::Retry(format!("HTTP {status}, body unreadable: {e}")))?;
    if status == 429 || status == 408 || status >= 500 {
        let what = match status {
            429 => "HTTP 429 (too many requests)".to_string(),
            408 => "HTTP 408 (request timeout)".to_string(),
            s => format!("HTTP {s}"),
        };
        let m = format!("{what}: {}", truncate(&text, 300));
        return Err(match wait {
            Some(d) => Failure::RetryAfter(format!("{m} (Retry-After {} s)", d.as_secs_f64()), d),
            None => Failure::Retry(m),
        });
    }
    if (400..500).contains(&status) {
        return Err(Failure::Refused(format!(
            "refused the request: HTTP {status}: {}",
            truncate(&text, 500)
        )));
    }
    if status != 200 {
        return Err(Failure::Retry(format!(
            "HTTP {status}: {}",
            truncate(&text, 300)
        )));
    }
    serde_json::from_str(&text).map_err(|e| {
        Failure::Retry(format!(
            "HTTP 200 with invalid JSON ({e}): {}",
            truncate(&text, 200)
        ))
    })
}

/// Runs `attempt` until it succeeds, is refused, or `retries + 1` attempts failed, waiting
/// 0.1 s · 2^i between attempts, or what the last failure's `Retry-After` asked when longer; the
/// error is the last failure's text with the number of attempts.
pub(crate) fn with_retries<T>(
    retries: u32,
    mut attempt: impl FnMut() -> Result<T, Failure>,
) -> Result<T, String> {
    let mut last = String::new();
    let mut asked = Duration::ZERO;
    for i in 0..=retries {
        if i > 0 {
            let backoff = Duration::from_millis(100 << (i - 1).min(8));
            std::thread::sleep(backoff.max(asked));
        }
        match attempt() {
            Ok(a) => return Ok(a),
            Err(Failure::Refused(m)) => return Err(m),
            Err(Failure::Retry(m)) => (last, asked) = (m, Duration::ZERO),
            Err(Failure::RetryAfter(m, d)) => (last, asked) = (m, d),
        }
    }
    Err(format!(
        "{last} (after {}; check the server, or raise retries or timeout_s)",
        match retries {
            0 => "1 attempt".to_string(),
            r => format!("{} attempts", r + 1),
        }
    ))
}

/// `job(k)` for every k in `0..n`, at most `in_flight` at once, results in order. After the first
/// error no new job starts; the jobs not run are `None`.
pub(crate) fn in_pool<T: Send, E: Send>(
    n: usize,
    in_flight: usize,
    job: impl Fn(usize) -> Result<T, E> + Sync,
) -> Vec<Option<Result<T, E>>> {
    let slots: Vec<Mutex<Option<Result<T, E>>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..in_flight.min(n) {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= n {
                    break;
                }
                let r = job(k);
                let stop = r.is_err();
                *slots[k].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                if stop {
                    // No new requests after a failure: the batch fails anyway.
                    next.store(n, Ordering::Relaxed);
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|s| s.into_inner().unwrap_or_else(|e| e.into_inner()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_a_url_are_redacted_and_refused() {
        assert_eq!(
            redact("http://user:s3cret@judge.local:8000/v1"),
            "http://***@judge.local:8000/v1"
        );
        assert_eq!(redact("http://h:1/a@b"), "http://h:1/a@b");
        assert_eq!(redact("http://127.0.0.1:8000"), "http://127.0.0.1:8000");
        let e = check_server("http://user:s3cret@judge.local:8000").unwrap_err();
        assert!(e.contains("api_key_env") && !e.contains("s3cret"), "{e}");
        assert!(check_server("http://127.0.0.1:8000/").is_ok());
        assert!(check_server("https://x").is_err());
    }

    #[test]
    fn retry_after_reads_seconds_and_is_capped() {
        let cap = Duration::from_secs(5);
        assert_eq!(retry_after(Some(" 2 "), cap), Some(Duration::from_secs(2)));
        assert_eq!(retry_after(Some("3600"), cap), Some(cap));
        assert_eq!(retry_after(Some("0"), cap), Some(Duration::ZERO));
        // The HTTP-date form and garbage fall back to the usual back-off.
        assert_eq!(
            retry_after(Some("Wed, 21 Oct 2026 07:28:00 GMT"), cap),
            None
        );
        assert_eq!(retry_after(Some("-1"), cap), None);
        assert_eq!(retry_after(None, cap), None);
    }
}
