//! A large `/v1/completions` answer is parsed into typed records, not a `serde_json::Value`
//! tree: the memory it takes beyond its body is a bounded multiple of the body (issue 34 item 4).
//! Allocations are counted by this test binary's global allocator; the file holds one test so
//! that no other test allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use rlvr_vllm::completion::{parse_group, CompletionAnswer};

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The peak of live bytes above those live before `f` ran, and `f`'s result.
fn peak_during<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let out = f();
    (PEAK.load(Ordering::SeqCst) - base, out)
}

/// vLLM's answer for `k` choices of `n` tokens each, with what it sends besides ids and
/// log-probs (token strings, top log-probs, text offsets, the text).
fn answer(k: usize, n: usize) -> String {
    let mut s = String::from("{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[");
    for j in 0..k {
        if j > 0 {
            s.push(',');
        }
        let ids: Vec<String> = (0..n).map(|t| ((t * 7919) % 151_000).to_string()).collect();
        let lps: Vec<String> = (0..n)
            .map(|t| format!("-{}.{:06}", t % 3, t % 999_983))
            .collect();
        let toks: Vec<String> = (0..n).map(|t| format!("\"t{}\"", t % 1000)).collect();
        let tops: Vec<String> = (0..n)
            .map(|t| format!("{{\"t{}\":-{}.{:06}}}", t % 1000, t % 3, t % 999_983))
            .collect();
        let offs: Vec<String> = (0..n).map(|t| (t * 3).to_string()).collect();
        s.push_str(&format!(
            "{{\"index\":{j},\"text\":\"{}\",\"token_ids\":[{}],\"logprobs\":{{\"tokens\":[{}],\
             \"token_logprobs\":[{}],\"top_logprobs\":[{}],\"text_offset\":[{}]}},\
             \"finish_reason\":\"length\",\"stop_reason\":null}}",
            "x".repeat(n),
            ids.join(","),
            toks.join(","),
            lps.join(","),
            tops.join(","),
            offs.join(",")
        ));
    }
    s.push_str("]}");
    s
}

#[test]
fn a_large_answer_takes_a_bounded_multiple_of_its_size() {
    let (k, n) = (4, 150_000);
    let body = answer(k, n);
    assert!(body.len() > 20 << 20, "{} bytes", body.len());
    let (typed, choices) = peak_during(|| {
        let a: CompletionAnswer = serde_json::from_str(&body).unwrap();
        parse_group(a, k, n).unwrap()
    });
    assert_eq!(choices.len(), k);
    assert!(choices.iter().all(|c| c.token_ids.len() == n));
    drop(choices);
    // What the typed parse keeps is ids (4 B) and log-probs (8 B while parsed, then 4 B) per
    // token, up to twice that while a vector grows: below the body, which holds 50-odd bytes
    // per token.
    assert!(
        typed < body.len(),
        "typed parse peaked at {typed} bytes for a body of {}",
        body.len()
    );
    // A `serde_json::Value` of the same body (what the client built before) takes several
    // times the body: the bound above is what typed parsing buys.
    let (value, v) = peak_during(|| serde_json::from_str::<serde_json::Value>(&body).unwrap());
    drop(v);
    assert!(
        value > 2 * body.len(),
        "a Value took {value} bytes for a body of {}",
        body.len()
    );
    println!(
        "body {} MB: typed parse peak {} MB, Value {} MB",
        body.len() >> 20,
        typed >> 20,
        value >> 20
    );
}
