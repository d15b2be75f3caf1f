//! One vLLM server over blocking HTTP: a request with retries and back-off, and the check of what
//! came back. Transport errors, timeouts, HTTP 5xx and answers that fail validation (truncated
//! JSON, a token count that differs from its log-prob count, ...) are retried; HTTP 4xx is not
//! (the request itself is wrong). A timed-out request is sent again only when the server answers
//! `GET /health` within [`HEALTH_PROBE_TIMEOUT`]: a hung server (connections accepted, nothing
//! answered) stops the caller after one timeout, about 3 minutes by default, not after every
//! retry's. The final error names the server and its last answer.

use std::time::Duration;

use serde_json::Value;

use crate::error::{Result, VllmError};

/// How often and how patiently a request is retried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts after the first (0 = no retry).
    pub retries: usize,
    /// Wait before the first retry; doubled before each further one, capped at 30 s.
    pub backoff: Duration,
    /// Whole-request timeout (connect, send, wait, read).
    pub timeout: Duration,
}

/// The default whole-request timeout, [`RetryPolicy::timeout`]: one group of completions must come
/// back within it. 180 s holds a group of 512-token completions on a loaded server many times
/// over; raise it (`rollout.request_timeout_s`) for completions of many thousand tokens or the
/// weight reload of a large model.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(180);

/// How long `GET /health` may take, after a request timed out, for the server to count as alive
/// and the request to be sent again (at most the request timeout itself).
pub const HEALTH_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            retries: 3,
            backoff: Duration::from_millis(500),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// Largest answer read by default (bytes, 256 MiB): a group of K completions with log-probs fits
/// many times over. A larger answer is refused naming the limit ([`Server::with_body_limit`]).
pub const BODY_LIMIT: u64 = 256 << 20;

/// Why one attempt failed.
enum Failure {
    /// Worth another attempt (down, 5xx, malformed answer).
    Retry(String),
    /// No answer within the timeout: worth another attempt only if the server answers
    /// `GET /health` (slow, not silent).
    Timeout(String),
    /// HTTP 4xx: status and body.
    Refused(u16, String),
}

/// A vLLM server: its base URL (e.g. `http://127.0.0.1:8000`, no trailing slash) and an agent.
pub struct Server {
    /// The base URL, without a trailing slash.
    pub url: String,
    agent: ureq::Agent,
    api_key: Option<String>,
    policy: RetryPolicy,
    body_limit: u64,
}

fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let head: String = s.chars().take(n).collect();
        format!("{head}… ({} bytes in all)", s.len())
    }
}

impl Server {
    /// A client for the server at `url` (http only; `https://` is refused since this build has
    /// no TLS: put the servers on a private network or localhost).
    ///
    /// # Errors
    /// [`VllmError::Config`] for a URL that does not start with `http://`.
    pub fn new(url: &str, api_key: Option<String>, policy: RetryPolicy) -> Result<Self> {
        let url = url.trim_end_matches('/').to_string();
        if !url.starts_with("http://") {
            return Err(VllmError::Config(format!(
                "server URL {url:?}: expected http://host:port (this build speaks plain HTTP only)"
            )));
        }
        // No redirects: ureq would re-send a POST as a body-less GET to the new address (issue 49
        // item 8); a 3xx is refused below, naming where it pointed.
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(policy.timeout))
            .build();
        Ok(Self {
            url,
            agent: ureq::Agent::new_with_config(config),
            api_key,
            policy,
            body_limit: BODY_LIMIT,
        })
    }

    /// The same client, reading answers of at most `bytes` (default [`BODY_LIMIT`]).
    pub fn with_body_limit(mut self, bytes: u64) -> Self {
        self.body_limit = bytes;
        self
    }

    /// The retry policy in force.
    pub fn policy(&self) -> RetryPolicy {
        self.policy
    }

    /// One attempt: the answer's body on HTTP 200.
    fn once(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> std::result::Result<String, Failure> {
        let url = format!("{}{}", self.url, path);
        let auth = self.api_key.as_ref().map(|k| format!("Bearer {k}"));
        let sent = match (method, body) {
            ("GET", _) => {
                let mut r = self.agent.get(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
            (_, Some(b)) => {
                let mut r = self.agent.post(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send_json(b)
            }
            (_, None) => {
                let mut r = self.agent.post(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send_empty()
            }
        };
        let mut resp = match sent {
            Ok(r) => r,
            Err(ureq::Error::Timeout(_)) => {
                return Err(Failure::Timeout(format!(
                    "no answer within {:.1} s (timeout)",
                    self.policy.timeout.as_secs_f64()
                )))
            }
            Err(e) => return Err(Failure::Retry(format!("transport error: {e}"))),
        };
        let status = resp.status().as_u16();
        if (300..400).contains(&status) {
            let location = resp
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("(no Location header)")
                .to_string();
            return Err(Failure::Refused(
                status,
                format!(
                    "a redirect to {location}: rlvr follows no redirects (a POST would be re-sent                      as a body-less GET); set the server's URL to the address that answers"
                ),
            ));
        }
        let text = match resp
            .body_mut()
            .with_config()
            .limit(self.body_limit)
            .read_to_string()
        {
            Ok(t) => t,
            Err(ureq::Error::BodyExceedsLimit(_)) => {
                return Err(Failure::Retry(format!(
                    "HTTP {status} with an answer larger than the limit of {} bytes ({:.0} MiB) \
                     read from a server: ask for fewer or shorter completions per request",
                    self.body_limit,
                    self.body_limit as f64 / (1 << 20) as f64
                )))
            }
            Err(e) => {
                return Err(Failure::Retry(format!(
                    "HTTP {status}, body unreadable: {e}"
                )))
            }
        };
        if (400..500).contains(&status) {
            return Err(Failure::Refused(status, cut(&text, 500)));
        }
        if status != 200 {
            return Err(Failure::Retry(format!(
                "HTTP {status}: {}",
                cut(&text, 300)
            )));
        }
        Ok(text)
    }

    /// Sends `method path` (GET, or POST with `body` as JSON / empty), then `check`s the parsed
    /// answer (an empty body parses as `null`). A failed attempt or check is retried per the
    /// policy, waiting `backoff · 2^i` (at most 30 s) before retry i.
    ///
    /// # Errors
    /// [`VllmError::Server`] after the last attempt, with the last answer;
    /// [`VllmError::Refused`] at once on HTTP 4xx and on a redirect (3xx, naming its
    /// `Location`: none is followed).
    pub fn call<T>(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        check: impl Fn(Value) -> std::result::Result<T, String>,
    ) -> Result<T> {
        self.call_text(method, path, body, |text| {
            let v = if text.trim().is_empty() {
                Value::Null
            } else {
                serde_json::from_str(text).map_err(|e| {
                    format!(
                        "HTTP 200 with invalid JSON ({e}; {} bytes): {}",
                        text.len(),
                        cut(text, 200)
                    )
                })?
            };
            check(v).map_err(|msg| format!("HTTP 200 with a malformed answer: {msg}"))
        })
    }

    /// As [`Server::call`], with the answer parsed into `A` (serde derive) instead of a
    /// [`serde_json::Value`]: what `A` skips (texts, token strings, top log-probs) is never held,
    /// so a large answer takes a small multiple of its size (the body once, then `A`), not the
    /// tens of bytes per number a `Value` tree spends. An empty body is malformed.
    ///
    /// # Errors
    /// As [`Server::call`].
    pub fn call_typed<A: serde::de::DeserializeOwned, T>(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        check: impl Fn(A) -> std::result::Result<T, String>,
    ) -> Result<T> {
        self.call_text(method, path, body, |text| {
            let a = serde_json::from_str::<A>(text).map_err(|e| {
                let what = if e.is_data() {
                    "a malformed answer"
                } else {
                    "invalid JSON"
                };
                format!(
                    "HTTP 200 with {what} ({e}; {} bytes): {}",
                    text.len(),
                    cut(text, 200)
                )
            })?;
            check(a).map_err(|msg| format!("HTTP 200 with a malformed answer: {msg}"))
        })
    }

    /// As [`Server::call`], for routes whose answer is plain text (vLLM's
    /// `/v1/load_lora_adapter` answers `Success: LoRA adapter '…' added successfully.`): `check`
    /// gets the body of an HTTP 200 and its error is the attempt's whole failure message.
    ///
    /// # Errors
    /// As [`Server::call`].
    pub fn call_text<T>(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        check: impl Fn(&str) -> std::result::Result<T, String>,
    ) -> Result<T> {
        let what = format!("{method} {}", path.split('?').next().unwrap_or(path));
        let attempts = self.policy.retries + 1;
        let mut last = String::new();
        for i in 0..attempts {
            if i > 0 {
                let wait = self
                    .policy
                    .backoff
                    .saturating_mul(1 << (i - 1).min(16) as u32);
                std::thread::sleep(wait.min(Duration::from_secs(30)));
            }
            match self.once(method, path, body) {
                Ok(text) => match check(&text) {
                    Ok(t) => return Ok(t),
                    Err(msg) => last = msg,
                },
                Err(Failure::Retry(msg)) => last = msg,
                Err(Failure::Timeout(msg)) => {
                    last = msg;
                    // A server that accepts connections and never answers (hung) would hold the
                    // run for every attempt's timeout: ask it for /health before trying again.
                    if i + 1 < attempts {
                        if let Err(why) = self.probe_health() {
                            return Err(VllmError::Server {
                                server: self.url.clone(),
                                what,
                                attempts: i + 1,
                                answer: format!(
                                    "{last}; then GET /health {why}: the server accepts \
                                     connections but does not answer (hung), so the request was \
                                     not sent again"
                                ),
                            });
                        }
                    }
                }
                Err(Failure::Refused(status, body)) => {
                    return Err(VllmError::Refused {
                        server: self.url.clone(),
                        what,
                        status,
                        body,
                    })
                }
            }
        }
        Err(VllmError::Server {
            server: self.url.clone(),
            what,
            attempts,
            answer: last,
        })
    }

    /// One `GET /health` within [`HEALTH_PROBE_TIMEOUT`] (or the request timeout, if shorter):
    /// `Ok` on HTTP 200, else what happened, worded to follow "GET /health".
    fn probe_health(&self) -> std::result::Result<(), String> {
        let limit = HEALTH_PROBE_TIMEOUT.min(self.policy.timeout);
        let url = format!("{}/health", self.url);
        let mut r = self
            .agent
            .get(&url)
            .config()
            .timeout_global(Some(limit))
            .build();
        if let Some(k) = &self.api_key {
            r = r.header("Authorization", format!("Bearer {k}"));
        }
        match r.call() {
            Ok(resp) if resp.status().as_u16() == 200 => Ok(()),
            Ok(resp) => Err(format!("answered HTTP {}", resp.status().as_u16())),
            Err(ureq::Error::Timeout(_)) => Err(format!(
                "did not answer within {:.1} s either",
                limit.as_secs_f64()
            )),
            Err(e) => Err(format!("failed too ({e})")),
        }
    }

    /// `GET /health` answered 200 (one attempt per retry; the body is ignored).
    ///
    /// # Errors
    /// As [`Server::call`].
    pub fn health(&self) -> Result<()> {
        self.call("GET", "/health", None, |_| Ok(()))
    }
}
