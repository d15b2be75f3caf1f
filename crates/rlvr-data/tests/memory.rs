//! A dataset of many short rows takes a bounded multiple of its file size once loaded (issue 34
//! item 4: a 398 MB file of short rows took ~25x its size): rows are read one at a time and each
//! problem keeps the fields it uses, never the row's JSON tree. Allocations are counted by this
//! test binary's global allocator; the file holds one test so that nothing else allocates
//! meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

use rlvr_data::config::{DataConfig, TaskKind};
use rlvr_data::dataset::load_file;

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

#[test]
fn many_short_rows_take_a_bounded_multiple_of_the_file() {
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    let rows = 200_000;
    for i in 0..rows {
        writeln!(
            f,
            "{{\"question\": \"{}+{}=\", \"answer\": \"{}\"}}",
            i % 997,
            i % 991,
            i % 997 + i % 991
        )
        .unwrap();
    }
    f.flush().unwrap();
    let size = std::fs::metadata(f.path()).unwrap().len() as usize;
    let cfg = DataConfig {
        task: TaskKind::Jsonl,
        ..Default::default()
    };
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let problems = load_file(&cfg, f.path()).unwrap();
    let peak = PEAK.load(Ordering::SeqCst) - base;
    assert_eq!(problems.len(), rows);
    println!(
        "{rows} rows, {size} bytes: load_file peaked at {peak} bytes ({:.1}x)",
        peak as f64 / size as f64
    );
    // Holding every row's JSON object (a BTreeMap node of ~600 bytes per row) took ~20x.
    assert!(peak < 10 * size, "{peak} bytes for a file of {size}");
}
