//! A small fake HTTP server for the fault tests: answers each request (one per connection,
//! `Connection: close`) with the next scripted reply, or with a handler's reply, and records
//! every request (method + path, body).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::Tensor;
use rlvr_model::Model;
use serde_json::Value;

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// HTTP status and body.
    Status(u16, String),
    /// 200 with a Content-Length larger than the bytes sent, then the connection is closed.
    Truncated(String),
    /// Waits, then 200 with the body.
    Slow(Duration, String),
    /// Closes the connection without answering.
    Hangup,
    /// A redirect: the status (3xx) with a `Location` header and an empty body.
    Redirect(u16, String),
}

/// A recorded request: "METHOD /path?query" and the body parsed as JSON (null when empty).
#[derive(Clone, Debug)]
pub struct Seen {
    pub line: String,
    pub body: Value,
}

type Handler = dyn Fn(&str, &Value) -> Reply + Send + Sync;

pub struct FakeServer {
    pub url: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeServer {
    /// Answers with `handler(request line, body)`.
    pub fn start(handler: impl Fn(&str, &Value) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let seen2 = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let (h, s) = (handler.clone(), seen2.clone());
                std::thread::spawn(move || serve(stream, &*h, &s));
            }
        });
        Self { url, seen }
    }

    /// Answers with the scripted replies in order; the last one repeats.
    pub fn scripted(replies: Vec<Reply>) -> Self {
        let queue = Mutex::new((replies, 0usize));
        Self::start(move |_, _| {
            let mut q = queue.lock().unwrap();
            let i = q.1.min(q.0.len() - 1);
            q.1 += 1;
            q.0[i].clone()
        })
    }

    pub fn lines(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.line.clone())
            .collect()
    }
}

fn serve(stream: TcpStream, handler: &Handler, seen: &Mutex<Vec<Seen>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut first = String::new();
    if reader.read_line(&mut first).is_err() {
        return;
    }
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
            break;
        }
        let lower = h.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; len];
    let _ = reader.read_exact(&mut body);
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let line = first
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    seen.lock().unwrap().push(Seen {
        line: line.clone(),
        body: body.clone(),
    });
    let mut stream = stream;
    let send_with = |stream: &mut TcpStream,
                     status: u16,
                     body: &str,
                     claimed: usize,
                     extra: &str| {
        let head = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {claimed}\r\n{extra}Connection: close\r\n\r\n"
        );
        let _ = stream.write_all(head.as_bytes());
        let _ = stream.write_all(body.as_bytes());
        let _ = stream.flush();
    };
    let send = |stream: &mut TcpStream, status: u16, body: &str, claimed: usize| {
        send_with(stream, status, body, claimed, "")
    };
    match handler(&line, &body) {
        Reply::Redirect(code, location) => send_with(
            &mut stream,
            code,
            "",
            0,
            &format!("Location: {location}\r\n"),
        ),
        Reply::Status(code, b) => send(&mut stream, code, &b, b.len()),
        Reply::Truncated(b) => send(&mut stream, 200, &b, b.len() + 100),
        Reply::Slow(d, b) => {
            std::thread::sleep(d);
            send(&mut stream, 200, &b, b.len())
        }
        Reply::Hangup => {}
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// A vLLM-style answer to a one-prompt request: choice j has `ids[j]` with `lps[j]`.
pub fn completion_answer(ids: &[Vec<u32>], lps: &[Vec<f32>], finish: &[(&str, Value)]) -> String {
    let choices: Vec<Value> = ids
        .iter()
        .zip(lps)
        .zip(finish)
        .enumerate()
        .map(|(j, ((i, l), (f, s)))| {
            serde_json::json!({"index": j, "token_ids": i, "text": "",
                "logprobs": {"token_logprobs": l, "tokens": [], "top_logprobs": null, "text_offset": []},
                "finish_reason": f, "stop_reason": s})
        })
        .collect();
    serde_json::json!({"id": "cmpl-1", "object": "text_completion", "choices": choices}).to_string()
}

/// The refresh check of the fake-server tests: a fixed sequence ([1, 2, 3] then [4, 5, 6, 7]) with
/// `m`'s log-probs of the completion at T = 1 as the expected values, tolerance 1e-4.
pub fn check_for(m: &rlvr_model::Model) -> rlvr_vllm::RefreshCheck {
    let (prompt, completion) = (vec![1, 2, 3], vec![4, 5, 6, 7]);
    let expected = rlvr_vllm::trainer_logprobs(m, &prompt, &completion, 1.0).unwrap();
    rlvr_vllm::RefreshCheck {
        prompt,
        completion,
        expected,
        tolerance: 1e-4,
    }
}

/// The JSON lines of a file (none when it is missing).
pub fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The model's parameters by name.
pub fn tensors(m: &Model) -> Vec<(String, Tensor)> {
    m.named_vars()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect()
}

/// A random one-layer Qwen2 model (vocabulary 64, hidden 16, 2 query heads and 1 KV head), its
/// embeddings tied or not, from `seed`: the fake-server tests' policy.
pub fn tiny_qwen2(tied: bool, seed: u64) -> Model {
    let config = rlvr_model::ModelConfig::from_json(
        &serde_json::json!({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 16,
                "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                "num_key_value_heads": 1, "max_position_embeddings": 64,
                "tie_word_embeddings": tied}),
        "inline".as_ref(),
    )
    .unwrap();
    Model::random(
        config,
        0.5,
        seed,
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap()
}
