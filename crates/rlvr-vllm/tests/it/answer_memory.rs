//! A large `/v1/completions` answer is parsed into typed records, not a `serde_json::Value`
//! tree: the memory it takes beyond its body is a bounded multiple of the body (issue 34 item 4).
//! Allocations are counted by the test binary's global allocator, for the test's own thread only
//! (the crate's other tests run beside it in the same binary; the parse uses no other thread).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

use rlvr_vllm::completion::{parse_group, CompletionAnswer};

/// The system allocator, counting the bytes live and their peak for the threads that ask
/// (`peak_during`). The crate's tests share one binary and so this allocator: counting only the
/// asking thread keeps the allocations of tests running beside it out of the figures.
struct Counting;

thread_local! {
    /// Whether this thread's allocations are counted. A `const` without a destructor: reading it
    /// never allocates, so the allocator may.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Bytes allocated minus bytes freed by counted threads since `peak_during` began (below zero
/// when they free what was allocated before), and the highest value it reached.
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn counted() -> bool {
    COUNTED.try_with(Cell::get).unwrap_or(false)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() && counted() {
            let size = layout.size() as isize;
            let now = LIVE.fetch_add(size, Ordering::SeqCst) + size;
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        if counted() {
            LIVE.fetch_sub(layout.size() as isize, Ordering::SeqCst);
        }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The peak of live bytes that this thread allocated while `f` ran, above those live before,
/// and `f`'s result. One counting at a time (the file's tests are one test).
fn peak_during<T>(f: impl FnOnce() -> T) -> (usize, T) {
    LIVE.store(0, Ordering::SeqCst);
    PEAK.store(0, Ordering::SeqCst);
    COUNTED.with(|c| c.set(true));
    let out = f();
    COUNTED.with(|c| c.set(false));
    (PEAK.load(Ordering::SeqCst) as usize, out)
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
