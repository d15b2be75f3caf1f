//! The process's memory over the trainer update, for diagnostics.jsonl's `memory/*` keys (verl
//! logs `perf/cpu_memory_used_gb` and the GPU's peak per step; this is the CPU side).
//!
//! A watcher thread samples, every [`PERIOD`] while the update runs, the heap memory in use
//! ([`rlvr_model::heap_in_use`], glibc's own count of live allocations) and keeps the largest.
//! An activation peak lasts through the backward pass (seconds), far longer than the period. The
//! heap count, not the resident size, because the `rlvr` binary keeps freed memory resident for
//! reuse ([`rlvr_model::keep_freed_memory`]): after step 1 the resident size no longer moves,
//! while the live heap rises and falls with each update's activations. The kernel's own peak
//! (`VmHWM`) is left alone: resetting it (`/proc/self/clear_refs`) would also falsify a
//! `/usr/bin/time` of the whole process. Off glibc (and Linux for the resident size) the values
//! are null.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the watcher samples the heap.
pub(crate) const PERIOD: Duration = Duration::from_millis(5);

/// The resident set size in bytes (`/proc/self/status`'s `VmRSS`, in KiB there); `None` where
/// it cannot be read.
fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A running watch over one update ([`UpdateMemory::begin`] … [`UpdateMemory::end`]).
pub(crate) struct UpdateMemory {
    rss: Option<u64>,
    heap: Option<u64>,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
}

/// What one update used, in MiB.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MemoryReport {
    /// `memory/rss_mib`: the process's resident size when the update began.
    pub rss_mib: Option<f64>,
    /// `memory/heap_mib`: live heap memory when the update began (weights, gradient buffers,
    /// optimizer moments, the explorer's copy, data).
    pub heap_mib: Option<f64>,
    /// `memory/update_peak_mib`: the most live heap memory seen during the update minus
    /// `heap_mib`: the activations and the update's temporaries (on step 1 also the gradient
    /// buffers and optimizer moments it allocates).
    pub update_peak_mib: Option<f64>,
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

impl UpdateMemory {
    /// Reads the sizes and starts the watcher (none off glibc).
    pub(crate) fn begin() -> Self {
        let heap = rlvr_model::heap_in_use();
        let peak = Arc::new(AtomicU64::new(heap.unwrap_or(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = heap.and_then(|_| {
            let (peak, stop) = (peak.clone(), stop.clone());
            std::thread::Builder::new()
                .name("rlvr-memory".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(h) = rlvr_model::heap_in_use() {
                            peak.fetch_max(h, Ordering::Relaxed);
                        }
                        std::thread::park_timeout(PERIOD);
                    }
                })
                .ok()
        });
        UpdateMemory {
            rss: rss_bytes(),
            heap,
            peak,
            stop,
            watcher,
        }
    }

    /// Stops the watcher and reports.
    pub(crate) fn end(mut self) -> MemoryReport {
        self.finish()
    }

    fn finish(&mut self) -> MemoryReport {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.watcher.take() {
            w.thread().unpark();
            let _ = w.join();
        }
        if let Some(h) = rlvr_model::heap_in_use() {
            self.peak.fetch_max(h, Ordering::Relaxed);
        }
        MemoryReport {
            rss_mib: self.rss.map(mib),
            heap_mib: self.heap.map(mib),
            update_peak_mib: self
                .heap
                .map(|h| mib(self.peak.load(Ordering::Relaxed).saturating_sub(h))),
        }
    }
}

impl Drop for UpdateMemory {
    /// An update that failed still stops its watcher.
    fn drop(&mut self) {
        if self.watcher.is_some() {
            self.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_held_during_the_update_shows_in_its_peak() {
        if rlvr_model::heap_in_use().is_none() {
            return; // not glibc: nothing to measure (the values are null)
        }
        let m = UpdateMemory::begin();
        // 256 MiB allocated, held for 50 ms, freed before the end.
        let v = std::hint::black_box(vec![1u8; 256 << 20]);
        std::thread::sleep(Duration::from_millis(50));
        drop(v);
        let r = m.end();
        // (Other tests of this binary run beside it and may free memory: a lower bound.)
        assert!(r.update_peak_mib.unwrap() >= 200.0, "{r:?}");
        assert!(r.heap_mib.unwrap() > 0.0, "{r:?}");
        if cfg!(target_os = "linux") {
            assert!(r.rss_mib.unwrap() > 0.0, "{r:?}");
        }
    }
}
