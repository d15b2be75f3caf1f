//! A fake HTTP server on 127.0.0.1 for the tests of the verifiers that ask a server (the judge, the
//! reward model): it answers each request by a given rule and records what it saw.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the fake server saw.
#[derive(Default)]
pub struct Seen {
    pub bodies: Mutex<Vec<serde_json::Value>>,
    pub now: AtomicUsize,
    pub peak: AtomicUsize,
    /// Each request's path (`/pooling`, ...), in arrival order.
    pub paths: Mutex<Vec<String>>,
}

/// A server answering every request with `reply(request number, body)` = (status, body, delay),
/// for at most `limit` requests; returns its URL and what it saw.
pub fn server(
    limit: usize,
    reply: impl Fn(usize, &serde_json::Value) -> (u16, String, u64) + Send + Sync + 'static,
) -> (String, Arc<Seen>) {
    server_with_headers(limit, move |n, body| {
        let (status, text, delay) = reply(n, body);
        (status, Vec::new(), text, delay)
    })
}

/// As [`server`], with extra headers in each answer: `reply` gives (status, headers as
/// `(name, value)`, body, delay).
pub fn server_with_headers(
    limit: usize,
    reply: impl Fn(usize, &serde_json::Value) -> (u16, Vec<(String, String)>, String, u64)
        + Send
        + Sync
        + 'static,
) -> (String, Arc<Seen>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = Arc::new(Seen::default());
    let reply = Arc::new(reply);
    let s = Arc::clone(&seen);
    std::thread::spawn(move || {
        for (n, conn) in l.incoming().take(limit).enumerate() {
            let Ok(mut conn) = conn else { continue };
            let (s, reply) = (Arc::clone(&s), Arc::clone(&reply));
            std::thread::spawn(move || {
                let now = s.now.fetch_add(1, Ordering::SeqCst) + 1;
                s.peak.fetch_max(now, Ordering::SeqCst);
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut len = 0;
                let mut request_line = String::new();
                r.read_line(&mut request_line).unwrap_or(0);
                let path = request_line.split(' ').nth(1).unwrap_or("").to_string();
                s.paths.lock().unwrap().push(path);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap();
                    }
                }
                let mut body = vec![0; len];
                r.read_exact(&mut body).unwrap();
                let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let (status, headers, text, delay) = reply(n, &body);
                let headers: String = headers
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}\r\n"))
                    .collect();
                s.bodies.lock().unwrap().push(body);
                std::thread::sleep(Duration::from_millis(delay));
                s.now.fetch_sub(1, Ordering::SeqCst);
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
            });
        }
    });
    (url, seen)
}

/// What the keep-alive server saw: connections accepted and each request's `Authorization`
/// header (`None` when absent), in arrival order.
#[derive(Default)]
pub struct SeenConnections {
    pub connections: AtomicUsize,
    pub auth: Mutex<Vec<Option<String>>>,
}

/// An HTTP/1.1 server that keeps connections open (as vLLM and hosted APIs do), answering every
/// request on a connection with `reply(body)` = (status, body) until the client closes it.
pub fn keep_alive_server(
    reply: impl Fn(&serde_json::Value) -> (u16, String) + Send + Sync + 'static,
) -> (String, Arc<SeenConnections>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = Arc::new(SeenConnections::default());
    let reply = Arc::new(reply);
    let s = Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            s.connections.fetch_add(1, Ordering::SeqCst);
            let (s, reply) = (Arc::clone(&s), Arc::clone(&reply));
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                loop {
                    let mut request_line = String::new();
                    if r.read_line(&mut request_line).unwrap_or(0) == 0 {
                        return;
                    }
                    let (mut len, mut auth) = (0, None);
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                        if lower.starts_with("authorization:") {
                            auth = Some(line["authorization:".len()..].trim().to_string());
                        }
                    }
                    let mut body = vec![0; len];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    s.auth.lock().unwrap().push(auth);
                    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let (status, text) = reply(&body);
                    let sent = write!(
                        conn,
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
                        text.len()
                    );
                    if sent.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, seen)
}
