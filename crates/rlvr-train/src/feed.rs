//! Where a step's batch comes from (DESIGN.md section 3): the explorer inline (o = 0), on its own
//! thread (o ≥ 1), or an offline experiences file; and the weight sync after every v-th step.

use std::sync::mpsc;

use anyhow::Context;
use candle_core::Tensor;
use rlvr_model::Model;

use crate::experience::Experience;
use crate::explorer::{Batch, Explorer, OfflineSource, SourceCursor};

/// Policy version whose weights sample the batch of step `t` (1-based) under interval `v`, offset `o`.
pub fn behaviour_version(t: u64, v: u64, o: u64) -> u64 {
    if t < 1 + o {
        0
    } else {
        v * ((t - 1 - o) / v)
    }
}

/// Where batches come from.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Feed {
    Inline(Box<Explorer>),
    Offline(OfflineSource),
    Threaded {
        batches: mpsc::Receiver<anyhow::Result<Batch>>,
        weights: Option<mpsc::Sender<(u64, Vec<Tensor>)>>,
        handle: Option<std::thread::JoinHandle<()>>,
        last_cursor: SourceCursor,
    },
}

impl Feed {
    pub(crate) fn next(&mut self, t: u64) -> anyhow::Result<Batch> {
        match self {
            Feed::Inline(e) => e.produce(t),
            Feed::Offline(o) => o.produce(t),
            Feed::Threaded {
                batches,
                last_cursor,
                ..
            } => {
                let b = batches.recv().context("the explorer thread stopped")??;
                *last_cursor = b.cursor;
                Ok(b)
            }
        }
    }

    /// After step `t` completed: the explorer sees the new weights when t is a multiple of v.
    pub(crate) fn publish(&mut self, t: u64, v: u64, model: &Model) -> anyhow::Result<()> {
        if !t.is_multiple_of(v) {
            return Ok(());
        }
        match self {
            Feed::Inline(e) => {
                let w: Vec<Tensor> = model
                    .named_vars()
                    .into_iter()
                    .map(|(_, v)| v.as_tensor().clone())
                    .collect();
                e.set_weights(t, &w)
            }
            Feed::Offline(_) => Ok(()),
            Feed::Threaded { weights, .. } => {
                let w: Vec<Tensor> = model
                    .named_vars()
                    .into_iter()
                    .map(|(_, v)| v.as_tensor().copy())
                    .collect::<candle_core::Result<_>>()?;
                if let Some(tx) = weights {
                    // A closed channel means the explorer already finished its last batch.
                    let _ = tx.send((t, w));
                }
                Ok(())
            }
        }
    }

    pub(crate) fn cursor(&self) -> SourceCursor {
        match self {
            Feed::Inline(e) => e.cursor(),
            Feed::Offline(o) => o.cursor(),
            Feed::Threaded { last_cursor, .. } => *last_cursor,
        }
    }

    pub(crate) fn shutdown(&mut self) {
        if let Feed::Threaded {
            weights,
            handle,
            batches,
            ..
        } = self
        {
            weights.take();
            // Unblock an explorer waiting to send.
            while batches.try_recv().is_ok() {}
            if let Some(h) = handle.take() {
                drop(std::mem::replace(batches, mpsc::sync_channel(0).1));
                let _ = h.join();
            }
        }
    }
}

pub(crate) type WeightsMsg = (u64, Vec<Tensor>);
pub(crate) type ExplorerThread = (
    mpsc::Receiver<anyhow::Result<Batch>>,
    mpsc::Sender<WeightsMsg>,
    std::thread::JoinHandle<()>,
);

/// The explorer thread of o ≥ 1: batch t waits for version s(t).
pub(crate) fn spawn_explorer(
    mut ex: Explorer,
    first_step: u64,
    last_step: u64,
    v: u64,
    o: u64,
) -> ExplorerThread {
    let (btx, brx) = mpsc::sync_channel::<anyhow::Result<Batch>>(o.max(1) as usize);
    let (wtx, wrx) = mpsc::channel::<(u64, Vec<Tensor>)>();
    let handle = std::thread::spawn(move || {
        for t in first_step..=last_step {
            let need = behaviour_version(t, v, o);
            while ex.version < need {
                let Ok((ver, w)) = wrx.recv() else { return };
                if let Err(e) = ex.set_weights(ver, &w) {
                    let _ = btx.send(Err(e));
                    return;
                }
            }
            let r = ex.produce(t);
            let failed = r.is_err();
            if btx.send(r).is_err() || failed {
                return;
            }
        }
    });
    (brx, wtx, handle)
}

/// Drops experiences whose staleness exceeds `max` (those without a version are kept). Returns the
/// kept ones and how many were dropped.
pub fn filter_stale(
    exps: Vec<Experience>,
    step: u64,
    max: Option<u64>,
) -> (Vec<Experience>, usize) {
    let Some(max) = max else {
        return (exps, 0);
    };
    let n = exps.len();
    let kept: Vec<Experience> = exps
        .into_iter()
        .filter(|e| e.staleness(step).is_none_or(|s| s <= max))
        .collect();
    let d = n - kept.len();
    (kept, d)
}
