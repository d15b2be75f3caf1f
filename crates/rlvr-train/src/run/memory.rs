//! The process's resident memory over the trainer update, for diagnostics.jsonl's `memory/*`
//! keys (verl logs `perf/cpu_memory_used_gb` and the GPU's peak per step; this is the CPU side).
//!
//! A watcher thread reads `/proc/self/status` (Linux) every [`PERIOD`] while the update runs and
//! keeps the largest resident size; the kernel's own peak (`VmHWM`) is left alone, since resetting
//! it (`/proc/self/clear_refs`) would also falsify a `/usr/bin/time` of the whole process. An
//! activation peak lasts through the backward pass (seconds), far longer than the period.
//! Elsewhere (no /proc) both values are null.
//!
//! The `rlvr` binary keeps freed memory for reuse ([`rlvr_model::keep_freed_memory`]): the first
//! update's peak is its whole need (activations, and the gradients and optimizer moments it
//! allocates), later updates reuse what the first left resident and show only new growth. Compare
//! step 1 across settings (`bench/share_prompt.sh` does).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the watcher reads the resident size.
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
    before: Option<u64>,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
}

/// What one update used: the resident size when it began and the largest seen above it, in MiB.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MemoryReport {
    /// `memory/rss_mib`: resident MiB when the update began (weights, optimizer state, buffers).
    pub rss_mib: Option<f64>,
    /// `memory/update_peak_mib`: the largest resident MiB seen during the update minus
    /// `rss_mib` (activations, gradients' growth, the optimizer's temporaries).
    pub update_peak_mib: Option<f64>,
}

impl UpdateMemory {
    /// Reads the resident size and starts the watcher (none where /proc cannot be read).
    pub(crate) fn begin() -> Self {
        let before = rss_bytes();
        let peak = Arc::new(AtomicU64::new(before.unwrap_or(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = before.and_then(|_| {
            let (peak, stop) = (peak.clone(), stop.clone());
            std::thread::Builder::new()
                .name("rlvr-memory".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(r) = rss_bytes() {
                            peak.fetch_max(r, Ordering::Relaxed);
                        }
                        std::thread::park_timeout(PERIOD);
                    }
                })
                .ok()
        });
        UpdateMemory {
            before,
            peak,
            stop,
            watcher,
        }
    }

    /// Stops the watcher and reports (one last reading included).
    pub(crate) fn end(mut self) -> MemoryReport {
        self.finish()
    }

    fn finish(&mut self) -> MemoryReport {
        self.stop.store(true, Ordering::Relaxed);
        let Some(w) = self.watcher.take() else {
            return MemoryReport::default();
        };
        w.thread().unpark();
        let _ = w.join();
        if let Some(r) = rss_bytes() {
            self.peak.fetch_max(r, Ordering::Relaxed);
        }
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let before = self.before.unwrap_or(0);
        MemoryReport {
            rss_mib: self.before.map(mib),
            update_peak_mib: Some(mib(self
                .peak
                .load(Ordering::Relaxed)
                .saturating_sub(before))),
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
    fn a_block_touched_during_the_update_shows_in_its_peak() {
        if rss_bytes().is_none() {
            return; // no /proc: nothing to measure (the values are null)
        }
        let m = UpdateMemory::begin();
        // 256 MiB written (every page touched), held for 50 ms, freed before the end.
        let mut v = vec![0u8; 256 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        std::thread::sleep(Duration::from_millis(50));
        drop(std::hint::black_box(v));
        let r = m.end();
        let peak = r.update_peak_mib.unwrap();
        // (Other tests of this binary run beside it: only a lower bound holds.)
        assert!(peak >= 200.0, "{r:?}");
        assert!(r.rss_mib.unwrap() > 0.0);
    }
}
