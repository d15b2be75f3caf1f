//! A dataset of many short rows takes a bounded multiple of its file size once loaded (issue 34
//! item 4: a 398 MB file of short rows took ~25x its size): rows are read one at a time and each
//! problem keeps the fields it uses, never the row's JSON tree. Allocations are counted by the test
//! binary's global allocator, for the test's own thread only (the crate's other tests run beside
//! it in the same binary; `load_file` uses no other thread).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicIsize, Ordering};

use rlvr_data::config::{DataConfig, TaskKind};
use rlvr_data::dataset::load_file;

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
    let (peak, problems) = peak_during(|| load_file(&cfg, f.path()).unwrap());
    assert_eq!(problems.len(), rows);
    println!(
        "{rows} rows, {size} bytes: load_file peaked at {peak} bytes ({:.1}x)",
        peak as f64 / size as f64
    );
    // Holding every row's JSON object (a BTreeMap node of ~600 bytes per row) took ~20x.
    assert!(peak < 10 * size, "{peak} bytes for a file of {size}");
}
