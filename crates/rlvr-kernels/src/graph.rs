//! CUDA-graph capture and replay of the sampler's decode step (issue 50): the control flow,
//! plain Rust and tested on the CPU ([`GraphCache`]), and the capture itself on a cudarc stream
//! (features `cuda` / `cudarc-check`: [`cuda`]).
//!
//! Why: a decode step of a 0.5B model is a few hundred small kernels whose launch and host-side
//! dispatch cost more than the GPU's work (issue 50: 14 ms per step for ~0.5 ms of arithmetic).
//! A CUDA graph records the step's launches once and replays them with one driver call.
//!
//! The rules a captured step must follow (what the fused decode step is built for):
//! - Everything the step reads that changes between steps (the new token ids, each row's rotary
//!   position, cache column and length) lives in device buffers allocated before the capture and
//!   written before each replay; grids and scalar arguments depend on the shapes only (the decode
//!   kernels read `pos`, `cols` and `lens` from memory: `triton::families::decode`).
//! - No allocation, host copy or host synchronisation inside the step: candle 0.11.1 refuses a
//!   device-to-host copy during a capture and, with `CudaDevice::enable_cuda_graph_htod_cache`
//!   held, turns host-to-device copies of constants into cached device buffers; cudarc's event
//!   tracking (per-slice events recorded and waited on around every use) is switched off while
//!   capturing, since the whole step runs on candle's one stream.
//! - One graph per batch-size bucket ([`buckets`]): a step of `rows` rows runs the graph of the
//!   smallest bucket ≥ `rows` (the extra rows are padding whose results are ignored), so a wave
//!   whose rows finish one by one replays a handful of graphs instead of capturing one per size.
//! - A graph is valid for what was baked into it ([`GraphKey`]: the bucket, the cache capacity
//!   and buffer generation, the weights' generation); anything else changed means capture again.
//!   Each bucket runs [`GraphCache::warmup_steps`] eager steps before its capture (module loads,
//!   cuBLAS workspaces and allocator growth happen outside the capture).
//!
//! Off switch: `kernels.cuda_graphs = "off"` (rlvr-model's `KernelSwitches`), or a failed capture
//! (the cache then disables itself, says why once, and runs every later step eagerly).

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Live [`CaptureBlock`]s of this process.
static CAPTURE_BLOCKS: Mutex<usize> = Mutex::new(0);

/// While one is alive, no CUDA graph is captured in this process: [`GraphCache::step`] treats
/// its capture as failed (graphs off for that cache, said once) and runs the step eagerly.
///
/// Every thread queues its GPU work on the device's one stream (rlvr-model's device), and a
/// capture records whatever any thread queues on that stream meanwhile; a thread that queues
/// work beside another's decode (the explorer thread of a run with sync offset ≥ 1, beside the
/// trainer's evaluation) holds one for its life. Replaying graphs captured before stays allowed
/// (a replay is one launch, ordered like any other).
#[derive(Debug)]
pub struct CaptureBlock(());

impl CaptureBlock {
    /// Blocks captures until the returned value is dropped.
    pub fn hold() -> Self {
        *CAPTURE_BLOCKS.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        CaptureBlock(())
    }

    /// Whether a [`CaptureBlock`] is alive.
    pub fn active() -> bool {
        *CAPTURE_BLOCKS.lock().unwrap_or_else(|e| e.into_inner()) > 0
    }
}

impl Drop for CaptureBlock {
    fn drop(&mut self) {
        *CAPTURE_BLOCKS.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
    }
}

/// The batch-size buckets for at most `max_rows` rows: 1, 2, 4, 8, then multiples of 16 up to
/// 256, then multiples of 64, ending with `max_rows` itself (the largest step). At most
/// `4 + 16 + (max_rows − 256) / 64 + 1` graphs; the padding a step runs is under 2× for small
/// batches and under 16 or 64 rows above.
///
/// `max_rows = 0` gives no bucket.
pub fn buckets(max_rows: usize) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    let mut b = 1;
    while b <= max_rows {
        out.push(b);
        b = match b {
            1..=4 => b * 2,
            8..=255 => (b / 16 + 1) * 16,
            _ => b + 64,
        };
    }
    if max_rows > 0 && out.last() != Some(&max_rows) {
        out.push(max_rows);
    }
    out
}

/// The bucket a step of `rows` rows runs in: the smallest of `buckets` (sorted ascending) that
/// holds it; `None` when `rows` is 0 or above the largest.
pub fn bucket_for(buckets: &[usize], rows: usize) -> Option<usize> {
    if rows == 0 {
        return None;
    }
    buckets.iter().copied().find(|b| *b >= rows)
}

/// What a captured graph baked in, besides its bucket: a graph is replayed only under the same
/// key, and captured again otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphKey {
    /// Cache columns per row (the KV buffers' shape).
    pub capacity: usize,
    /// Bumped whenever the step's device buffers are reallocated (a new wave's cache, a
    /// compaction that moved rows to new buffers): their addresses are in the graph.
    pub buffers: u64,
    /// Bumped when the weights' storage changes (a reload; in-place updates keep the
    /// addresses and need no new capture).
    pub weights: u64,
}

/// What one step did (returned by [`GraphCache::step`]; counted in [`GraphStats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ran eagerly on `rows` rows: graphs are off (or were disabled), or no bucket holds the step.
    Eager,
    /// Ran eagerly at the bucket's size, a warm-up before the capture.
    Warmup(usize),
    /// Captured the bucket's graph, then launched it (a capture only records).
    Capture(usize),
    /// Replayed the bucket's graph.
    Replay(usize),
}

/// Counts of [`Action`]s since the cache was made (for `rlvr bench sample`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GraphStats {
    /// Eager steps.
    pub eager: u64,
    /// Warm-up steps.
    pub warmups: u64,
    /// Captures.
    pub captures: u64,
    /// Replays (a capture's own launch not included).
    pub replays: u64,
}

enum Slot<G> {
    Warming { key: GraphKey, done: usize },
    Ready { key: GraphKey, graph: G },
}

/// The graphs of one sampler's decode step, one per bucket, with the decision of what each step
/// does. Generic over the graph type: `cudarc::driver::CudaGraph` on a GPU, anything in tests.
pub struct GraphCache<G> {
    buckets: Vec<usize>,
    /// Eager steps a bucket runs before its capture (at least 1).
    pub warmup_steps: usize,
    slots: BTreeMap<usize, Slot<G>>,
    disabled: Option<String>,
    stats: GraphStats,
}

impl<G> GraphCache<G> {
    /// A cache for steps of up to `max_rows` rows; `enabled = false` runs every step eagerly.
    pub fn new(max_rows: usize, enabled: bool) -> Self {
        GraphCache {
            buckets: buckets(max_rows),
            warmup_steps: 1,
            slots: BTreeMap::new(),
            disabled: (!enabled).then(|| "kernels.cuda_graphs is off".to_string()),
            stats: GraphStats::default(),
        }
    }

    /// The buckets.
    pub fn buckets(&self) -> &[usize] {
        &self.buckets
    }

    /// Why graphs are not used, when they are not.
    pub fn disabled(&self) -> Option<&str> {
        self.disabled.as_deref()
    }

    /// The counts so far.
    pub fn stats(&self) -> GraphStats {
        self.stats
    }

    /// Graphs captured and held now.
    pub fn captured(&self) -> usize {
        (self.slots.values())
            .filter(|s| matches!(s, Slot::Ready { .. }))
            .count()
    }

    /// Drops every graph (e.g. before the memory they pin is needed); the next steps warm up and
    /// capture again.
    pub fn clear(&mut self) {
        self.slots.clear();
    }

    /// Runs one decode step of `rows` rows under `key`:
    /// - graphs off or disabled, or no bucket holds `rows`: `eager(rows)`;
    /// - the bucket has no graph for `key` (none yet, or one captured under another key, which
    ///   is dropped): `eager(bucket)` for [`GraphCache::warmup_steps`] steps, then
    ///   `capture(bucket)`, which records the step and returns its graph, then `replay(&graph)`
    ///   (the capture only recorded the work);
    /// - otherwise `replay(&graph)`.
    ///
    /// A failed capture, or a capture due while a [`CaptureBlock`] is alive, disables graphs for
    /// the rest of the cache's life (the reason is kept, [`GraphCache::disabled`]) and the step
    /// runs `eager(rows)`; errors of `eager` and `replay` are returned as they are.
    pub fn step<E>(
        &mut self,
        rows: usize,
        key: GraphKey,
        mut eager: impl FnMut(usize) -> Result<(), E>,
        capture: impl FnOnce(usize) -> Result<G, E>,
        mut replay: impl FnMut(&G) -> Result<(), E>,
    ) -> Result<Action, E>
    where
        E: std::fmt::Display,
    {
        let bucket = match (&self.disabled, bucket_for(&self.buckets, rows)) {
            (None, Some(b)) => b,
            _ => {
                eager(rows)?;
                self.stats.eager += 1;
                return Ok(Action::Eager);
            }
        };
        let slot = self
            .slots
            .entry(bucket)
            .or_insert(Slot::Warming { key, done: 0 });
        let stale = match slot {
            Slot::Warming { key: k, .. } | Slot::Ready { key: k, .. } => *k != key,
        };
        if stale {
            *slot = Slot::Warming { key, done: 0 };
        }
        match slot {
            Slot::Ready { graph, .. } => {
                replay(graph)?;
                self.stats.replays += 1;
                Ok(Action::Replay(bucket))
            }
            Slot::Warming { done, .. } if *done < self.warmup_steps.max(1) => {
                eager(bucket)?;
                *done += 1;
                self.stats.warmups += 1;
                Ok(Action::Warmup(bucket))
            }
            Slot::Warming { .. } if CaptureBlock::active() => {
                self.disabled = Some(
                    "another thread queues work on the GPU's stream (an explorer thread beside \
                     the trainer): a capture would record it"
                        .to_string(),
                );
                self.slots.clear();
                eager(rows)?;
                self.stats.eager += 1;
                Ok(Action::Eager)
            }
            Slot::Warming { .. } => match capture(bucket) {
                Ok(graph) => {
                    replay(&graph)?;
                    self.slots.insert(bucket, Slot::Ready { key, graph });
                    self.stats.captures += 1;
                    Ok(Action::Capture(bucket))
                }
                Err(e) => {
                    self.disabled = Some(format!("capturing the {bucket}-row step failed: {e}"));
                    self.slots.clear();
                    eager(rows)?;
                    self.stats.eager += 1;
                    Ok(Action::Eager)
                }
            },
        }
    }
}

/// The capture on a cudarc stream (features `cuda`, `cudarc-check`). Unrun until a GPU runs it:
/// type-checked only (`cargo check -p rlvr-kernels --features cudarc-check`).
#[cfg(any(feature = "cuda", feature = "cudarc-check"))]
pub mod cuda {
    use std::sync::Arc;

    #[cfg(feature = "cuda")]
    use candle_core::cuda_backend::cudarc;
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    use cudarc::driver::{CudaGraph, CudaStream};

    use crate::triton::{Result, TritonError};

    fn driver(what: &str, e: impl std::fmt::Debug) -> TritonError {
        TritonError::Driver(format!("{what}: {e:?}"))
    }

    /// Records what `body` queues on `stream` into a graph (thread-local capture mode: other
    /// threads' CUDA calls are not affected), with cudarc's event tracking off meanwhile and
    /// restored after. `body` must queue work on `stream` only, allocate nothing and copy
    /// nothing to the host (module docs).
    ///
    /// Errors: a driver error beginning or ending the capture (an illegal call inside `body`
    /// surfaces here: the capture is invalidated), `body`'s own error (the capture is ended and
    /// dropped first), or an empty capture.
    pub fn capture(
        stream: &Arc<CudaStream>,
        body: impl FnOnce() -> Result<()>,
    ) -> Result<CudaGraph> {
        let ctx = stream.context();
        let tracking = ctx.is_event_tracking();
        // SAFETY: while tracking is off, no slice records or waits on events. The captured step
        // queues all its work on this one stream (documented contract of `body`), so stream order
        // alone orders every read after its write; tracking is restored before returning, and
        // slices created meanwhile (none: `body` allocates nothing) would only lack events.
        unsafe { ctx.disable_event_tracking() };
        let out = (|| {
            // An error an earlier operation left pending would make cudarc's `end_capture`
            // return it before ending the capture: surface it now, outside any capture.
            (ctx.check_err()).map_err(|e| driver("a CUDA error pending before the capture", e))?;
            (stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
                .map_err(|e| driver("begin capture", e))?;
            let ran = body();
            let ended = stream.end_capture(CUgraphInstantiate_flags(0));
            if ended.is_err() {
                end_abandoned_capture(stream);
            }
            ran?;
            match ended.map_err(|e| driver("end capture", e))? {
                Some(g) => Ok(g),
                None => Err(TritonError::Driver(
                    "the captured decode step queued no work".into(),
                )),
            }
        })();
        if tracking {
            // SAFETY: restores the state found on entry; slices keep their own tracking flag.
            unsafe { ctx.enable_event_tracking() };
        }
        let g = out?;
        g.upload().map_err(|e| driver("graph upload", e))?;
        Ok(g)
    }

    /// Ends a capture that `CudaStream::end_capture` left open (it returns a pending error
    /// before ending it), so the stream runs work again instead of recording it; the half-made
    /// graph is destroyed.
    fn end_abandoned_capture(stream: &Arc<CudaStream>) {
        use cudarc::driver::{result, sys};
        let mut status = std::mem::MaybeUninit::uninit();
        // SAFETY: the stream is live; the status is read only when the query succeeded; a graph
        // ended here is ours alone and destroyed at once.
        unsafe {
            let capturing = sys::cuStreamIsCapturing(stream.cu_stream(), status.as_mut_ptr())
                == sys::CUresult::CUDA_SUCCESS
                && status.assume_init()
                    != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            if capturing {
                if let Ok(g) = result::stream::end_capture(stream.cu_stream()) {
                    if !g.is_null() {
                        let _ = result::graph::destroy(g);
                    }
                }
            }
        }
    }

    /// Replays `graph` on the stream it was captured on.
    ///
    /// Errors: the driver's.
    pub fn replay(graph: &CudaGraph) -> Result<()> {
        graph.launch().map_err(|e| driver("graph launch", e))
    }

    /// [`capture`] on candle's stream with candle's host-to-device copy cache held
    /// (`CudaDevice::enable_cuda_graph_htod_cache`), so that a constant uploaded inside the
    /// step becomes a cached device buffer instead of a copy the capture would refuse.
    ///
    /// Errors: [`capture`]'s.
    #[cfg(feature = "cuda")]
    pub fn capture_candle(
        dev: &candle_core::CudaDevice,
        body: impl FnOnce() -> Result<()>,
    ) -> Result<CudaGraph> {
        let _guard = dev.enable_cuda_graph_htod_cache();
        capture(&dev.cuda_stream(), body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests of this module one at a time: [`CaptureBlock`] is process-wide, and the test
    /// holding one would turn the others' captures off.
    fn serial() -> std::sync::MutexGuard<'static, ()> {
        static LOCK: Mutex<()> = Mutex::new(());
        LOCK.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn buckets_cover_every_batch() {
        let _serial = serial();
        assert_eq!(buckets(0), Vec::<usize>::new());
        assert_eq!(buckets(1), [1]);
        assert_eq!(buckets(6), [1, 2, 4, 6]);
        assert_eq!(buckets(64), [1, 2, 4, 8, 16, 32, 48, 64]);
        let b = buckets(300);
        assert_eq!(&b[..5], [1, 2, 4, 8, 16]);
        assert_eq!(&b[b.len() - 3..], [240, 256, 300]);
        for max in [1usize, 7, 64, 256, 257, 1000] {
            let b = buckets(max);
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
            assert_eq!(*b.last().unwrap(), max);
            for rows in 1..=max {
                let k = bucket_for(&b, rows).unwrap();
                assert!(k >= rows);
                // padding: under 2x below 16 rows, under 16 rows to 256, under 64 above
                let slack = if rows <= 16 {
                    rows
                } else if rows <= 256 {
                    16
                } else {
                    64
                };
                assert!(k - rows < slack.max(1), "{max} {rows} {k}");
            }
            assert_eq!(bucket_for(&b, max + 1), None);
            assert_eq!(bucket_for(&b, 0), None);
        }
    }

    /// A stand-in graph: the bucket and key it was captured for.
    #[derive(Debug, PartialEq)]
    struct Fake {
        bucket: usize,
        key: GraphKey,
    }

    struct Log {
        calls: Vec<String>,
    }

    fn run(
        c: &mut GraphCache<Fake>,
        log: &mut Log,
        rows: usize,
        key: GraphKey,
        fail_capture: bool,
    ) -> Action {
        let calls = std::cell::RefCell::new(Vec::new());
        let a = c
            .step(
                rows,
                key,
                |n| {
                    calls.borrow_mut().push(format!("eager {n}"));
                    Ok::<_, String>(())
                },
                |b| {
                    calls.borrow_mut().push(format!("capture {b}"));
                    if fail_capture {
                        Err("illegal call during capture".to_string())
                    } else {
                        Ok(Fake { bucket: b, key })
                    }
                },
                |g| {
                    assert_eq!(g.key, key, "a graph replayed under another key");
                    calls.borrow_mut().push(format!("replay {}", g.bucket));
                    Ok(())
                },
            )
            .unwrap();
        log.calls.extend(calls.into_inner());
        a
    }

    const K: GraphKey = GraphKey {
        capacity: 384,
        buffers: 0,
        weights: 0,
    };

    #[test]
    fn warm_up_then_capture_then_replay_per_bucket() {
        let _serial = serial();
        let mut c = GraphCache::<Fake>::new(64, true);
        let mut log = Log { calls: vec![] };
        assert_eq!(run(&mut c, &mut log, 64, K, false), Action::Warmup(64));
        assert_eq!(run(&mut c, &mut log, 64, K, false), Action::Capture(64));
        assert_eq!(run(&mut c, &mut log, 64, K, false), Action::Replay(64));
        // rows finish: 50 rows run in the 64 bucket's graph, 40 in the 48 bucket (new graph)
        assert_eq!(run(&mut c, &mut log, 50, K, false), Action::Replay(64));
        assert_eq!(run(&mut c, &mut log, 40, K, false), Action::Warmup(48));
        assert_eq!(run(&mut c, &mut log, 33, K, false), Action::Capture(48));
        assert_eq!(run(&mut c, &mut log, 64, K, false), Action::Replay(64));
        assert_eq!(
            log.calls,
            [
                "eager 64",
                "capture 64",
                "replay 64",
                "replay 64",
                "replay 64",
                "eager 48",
                "capture 48",
                "replay 48",
                "replay 64"
            ]
        );
        assert_eq!(c.captured(), 2);
        assert_eq!(
            c.stats(),
            GraphStats {
                eager: 0,
                warmups: 2,
                captures: 2,
                replays: 3
            }
        );
    }

    #[test]
    fn a_changed_key_captures_again() {
        let _serial = serial();
        let mut c = GraphCache::<Fake>::new(8, true);
        c.warmup_steps = 2;
        let mut log = Log { calls: vec![] };
        for _ in 0..2 {
            assert_eq!(run(&mut c, &mut log, 8, K, false), Action::Warmup(8));
        }
        assert_eq!(run(&mut c, &mut log, 8, K, false), Action::Capture(8));
        assert_eq!(run(&mut c, &mut log, 8, K, false), Action::Replay(8));
        // a new wave's buffers, another capacity, reloaded weights: each warms up and captures
        for k in [
            GraphKey { buffers: 1, ..K },
            GraphKey {
                buffers: 1,
                capacity: 100,
                ..K
            },
            GraphKey {
                buffers: 1,
                capacity: 100,
                weights: 3,
            },
        ] {
            assert_eq!(run(&mut c, &mut log, 8, k, false), Action::Warmup(8));
            assert_eq!(run(&mut c, &mut log, 7, k, false), Action::Warmup(8));
            assert_eq!(run(&mut c, &mut log, 5, k, false), Action::Capture(8));
            assert_eq!(run(&mut c, &mut log, 6, k, false), Action::Replay(8));
        }
        assert_eq!(c.captured(), 1);
        c.clear();
        assert_eq!(c.captured(), 0);
        assert_eq!(run(&mut c, &mut log, 8, K, false), Action::Warmup(8));
    }

    #[test]
    fn off_switch_and_oversized_steps_run_eagerly() {
        let _serial = serial();
        let mut c = GraphCache::<Fake>::new(16, false);
        let mut log = Log { calls: vec![] };
        for rows in [16, 16, 16, 3] {
            assert_eq!(run(&mut c, &mut log, rows, K, false), Action::Eager);
        }
        assert_eq!(log.calls, ["eager 16", "eager 16", "eager 16", "eager 3"]);
        assert!(c.disabled().unwrap().contains("kernels.cuda_graphs"));
        let mut c = GraphCache::<Fake>::new(16, true);
        assert_eq!(run(&mut c, &mut log, 17, K, false), Action::Eager);
        assert_eq!(c.stats().eager, 1);
    }

    #[test]
    fn a_failed_capture_disables_graphs() {
        let _serial = serial();
        let mut c = GraphCache::<Fake>::new(4, true);
        let mut log = Log { calls: vec![] };
        assert_eq!(run(&mut c, &mut log, 3, K, false), Action::Warmup(4));
        assert_eq!(run(&mut c, &mut log, 3, K, true), Action::Eager);
        assert!(c.disabled().unwrap().contains("illegal call"));
        assert_eq!(run(&mut c, &mut log, 3, K, false), Action::Eager);
        assert_eq!(log.calls, ["eager 4", "capture 4", "eager 3", "eager 3"]);
        assert_eq!(c.captured(), 0);
    }

    /// A capture due while a [`CaptureBlock`] is alive runs eagerly and turns the cache's graphs
    /// off, saying why; graphs captured before the block keep replaying; with the block dropped,
    /// a new cache captures again.
    #[test]
    fn a_capture_block_runs_the_step_eagerly_and_replays_stay() {
        let _serial = serial();
        let mut log = Log { calls: vec![] };
        let mut ready = GraphCache::<Fake>::new(4, true);
        assert_eq!(run(&mut ready, &mut log, 4, K, false), Action::Warmup(4));
        assert_eq!(run(&mut ready, &mut log, 4, K, false), Action::Capture(4));
        let block = CaptureBlock::hold();
        assert!(CaptureBlock::active());
        assert_eq!(run(&mut ready, &mut log, 3, K, false), Action::Replay(4));
        let mut c = GraphCache::<Fake>::new(4, true);
        assert_eq!(run(&mut c, &mut log, 3, K, false), Action::Warmup(4));
        assert_eq!(run(&mut c, &mut log, 3, K, false), Action::Eager);
        assert!(
            c.disabled().unwrap().contains("another thread"),
            "{:?}",
            c.disabled()
        );
        assert_eq!(c.captured(), 0);
        let nested = CaptureBlock::hold();
        drop(block);
        assert!(CaptureBlock::active());
        drop(nested);
        assert!(!CaptureBlock::active());
        let mut c = GraphCache::<Fake>::new(4, true);
        assert_eq!(run(&mut c, &mut log, 3, K, false), Action::Warmup(4));
        assert_eq!(run(&mut c, &mut log, 3, K, false), Action::Capture(4));
        assert_eq!(
            log.calls,
            [
                "eager 4",
                "capture 4",
                "replay 4",
                "replay 4",
                "eager 4",
                "eager 3",
                "eager 4",
                "capture 4",
                "replay 4"
            ]
        );
    }

    #[test]
    fn eager_and_replay_errors_propagate() {
        let _serial = serial();
        let mut c = GraphCache::<Fake>::new(2, true);
        let e = c.step(
            2,
            K,
            |_| Err("out of memory".to_string()),
            |b| Ok(Fake { bucket: b, key: K }),
            |_| Ok(()),
        );
        assert_eq!(e.unwrap_err(), "out of memory");
        c.step(
            2,
            K,
            |_| Ok::<(), String>(()),
            |b| Ok(Fake { bucket: b, key: K }),
            |_| Ok(()),
        )
        .unwrap();
        let e = c.step(
            2,
            K,
            |_| Ok(()),
            |b| Ok(Fake { bucket: b, key: K }),
            |_| Err("launch failed".to_string()),
        );
        assert_eq!(e.unwrap_err(), "launch failed");
        assert!(c.disabled().is_none());
    }
}
