//! The explorer thread's own weights, as a stop's checkpoint may save them (o ≥ 1).
//!
//! A stop (Ctrl-C, SIGTERM) after step t whose in-flight batches were sampled by weights the run no
//! longer keeps (with `sync.interval = 1` every in-flight batch is: step t+1's is version t − o's)
//! used to wait for those batches, however long the explorer took (a slow verifier, a large
//! batch), so that the resume was exact. The explorer itself still holds the weights of the batch
//! it is sampling: [`LiveWeights`] shares them (a [`Model`] whose variables are the explorer's
//! own, no copy), and [`LoadGate`] keeps the explorer from loading the next version while a
//! checkpoint saves them. The checkpoint then keeps the batches already finished, the explorer's
//! weights and its version, and the resume samples the unfinished batch again, exactly; the stop
//! waits at most for a weight load in progress, not for a batch.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use rlvr_model::Model;

/// Orders the explorer thread's weight loads against a checkpoint reading its weights: a load
/// waits while a [`Hold`] is out, and a hold waits for a load in progress to end.
#[derive(Debug)]
pub struct LoadGate {
    state: Mutex<LoadGateState>,
    changed: Condvar,
}

#[derive(Debug)]
struct LoadGateState {
    /// The version of the weights the explorer holds (set at the end of each load).
    version: u64,
    /// A load is in progress.
    loading: bool,
    /// A checkpoint holds the weights.
    held: bool,
    /// No load failed: a failed one may have replaced part of the weights, which are then
    /// no version's.
    intact: bool,
}

impl LoadGate {
    /// A gate over an explorer starting with the weights of `version`.
    pub fn new(version: u64) -> Arc<LoadGate> {
        Arc::new(LoadGate {
            state: Mutex::new(LoadGateState {
                version,
                loading: false,
                held: false,
                intact: true,
            }),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LoadGateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The explorer thread's side: runs `load` (which replaces the explorer's weights and returns
    /// its version afterwards, or an error) once no checkpoint holds them, and records the version
    /// (a failed load keeps it and marks the weights as no longer intact).
    ///
    /// # Errors
    /// `load`'s.
    pub fn load(&self, load: impl FnOnce() -> anyhow::Result<u64>) -> anyhow::Result<()> {
        let mut s = self.lock();
        while s.held {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.loading = true;
        drop(s);
        let r = load();
        let mut s = self.lock();
        s.loading = false;
        match &r {
            Ok(v) => s.version = *v,
            Err(_) => s.intact = false,
        }
        self.changed.notify_all();
        r.map(|_| ())
    }

    /// The checkpoint's side: waits for a load in progress to end, then keeps the explorer from
    /// loading another version until the returned [`Hold`] drops.
    pub fn hold(self: &Arc<Self>) -> Hold {
        let mut s = self.lock();
        while s.loading {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.held = true;
        Hold {
            version: s.version,
            intact: s.intact,
            gate: self.clone(),
        }
    }
}

/// The explorer's weights held still ([`LoadGate::hold`]); dropping it lets the explorer load again.
#[derive(Debug)]
pub struct Hold {
    /// The version of the weights the explorer holds.
    pub version: u64,
    /// Whether they are that version's: false once a load failed (perhaps half way).
    pub intact: bool,
    gate: Arc<LoadGate>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut s = self.gate.lock();
        s.held = false;
        self.gate.changed.notify_all();
    }
}

/// The explorer thread's weights, shared: `model` has the explorer's own variables (a clone of its
/// local model shares their storage, and the explorer loads each version into them in place), so
/// that under a [`Hold`] of `gate` it is the explorer's version, `hold.version`.
pub struct LiveWeights {
    /// The explorer's model (the same variables).
    pub model: Model,
    /// The explorer thread's loads go through it.
    pub gate: Arc<LoadGate>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A load waits while a hold is out, and a hold for a load in progress; the version recorded
    /// is the load's; a failed load keeps the version and marks the weights as not intact.
    #[test]
    fn loads_and_holds_exclude_each_other() {
        let gate = LoadGate::new(3);
        let h = gate.hold();
        assert_eq!(h.version, 3);
        let g = gate.clone();
        let loader = std::thread::spawn(move || g.load(|| Ok(4)));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!loader.is_finished(), "a load ran under a hold");
        drop(h);
        loader.join().unwrap().unwrap();
        assert_eq!(gate.hold().version, 4);
        let g = gate.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let slow = std::thread::spawn(move || {
            g.load(|| {
                tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(200));
                Ok(5)
            })
        });
        rx.recv().unwrap();
        // Taken only once the load in progress has ended: its version.
        assert_eq!(gate.hold().version, 5);
        slow.join().unwrap().unwrap();
        assert!(gate.hold().intact);
        assert!(gate.load(|| anyhow::bail!("no")).is_err());
        let h = gate.hold();
        assert_eq!((h.version, h.intact), (5, false));
    }
}
