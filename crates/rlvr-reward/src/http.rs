//! The HTTP side shared by the verifiers that ask a server ([`crate::judge`],
//! [`crate::reward_model`]): one JSON POST with a body limit, the retry policy (a timeout, a
//! transport error, an HTTP 5xx or a malformed answer is retried, waiting 0.1 s · 2^i; an HTTP 4xx
//! fails at once), and a bounded pool of requests in flight.

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
    /// HTTP 4xx: the server refused the request; another attempt would be refused too.
    Refused(String),
}

/// A plain-HTTP client with a per-request timeout, answering every status (no status is an
/// error of the transport).
pub(crate) fn agent(timeout: Duration) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build();
    ureq::Agent::new_with_config(config)
}

/// One POST of `body` to `url`: the answer's JSON when the status is 200.
pub(crate) fn post_json(
    agent: &ureq::Agent,
    url: &str,
    body: &Value,
    timeout_s: f64,
) -> Result<Value, Failure> {
    let mut resp = match agent.post(url).send_json(body) {
        Ok(r) => r,
        Err(ureq::Error::Timeout(_)) => {
            return Err(Failure::Retry(format!(
                "no answer within {timeout_s:.1} s (timeout_s)"
            )))
        }
        Err(e) => return Err(Failure::Retry(format!("transport error: {e}"))),
    };
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .with_config()
        .limit(BODY_LIMIT)
        .read_to_string()
        .map_err(|e| Failure::Retry(format!("HTTP {status}, body unreadable: {e}")))?;
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

/// Runs `attempt` until it succeeds, is refused, or `retries + 1` attempts failed; the error is
/// the last failure's text with the number of attempts.
pub(crate) fn with_retries<T>(
    retries: u32,
    mut attempt: impl FnMut() -> Result<T, Failure>,
) -> Result<T, String> {
    let mut last = String::new();
    for i in 0..=retries {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(100 << (i - 1).min(8)));
        }
        match attempt() {
            Ok(a) => return Ok(a),
            Err(Failure::Refused(m)) => return Err(m),
            Err(Failure::Retry(m)) => last = m,
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
