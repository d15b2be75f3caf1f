//! Where a step's batch comes from (DESIGN.md section 3): the explorer, inline for sync offset
//! o = 0 and on its own thread for o ≥ 1, or an offline experiences file; when the trainer's
//! weights reach the explorer; and the one place that picks the rollout backend ([`backend`]).
//!
//! - [`schedule`]: the staleness rule s(t) and the stale filter;
//! - [`prompts`]: the `[data]` split rendered with the policy's tokenizer, within the model's
//!   positions;
//! - [`explorer`]: sampling and scoring one step's batch, DAPO's dynamic sampling, behaviour
//!   log-prob recomputation;
//! - [`offline`]: the experiences file in place of the explorer;
//! - [`backend`]: the native engine or vLLM servers, for train, eval and generate alike.
//!
//! Architecture invariant: a batch depends only on the explorer's weights, the source cursor and
//! the run seed, never on timing, so the inline and the threaded explorer give the same batches
//! and a resumed run the batches an uninterrupted one would. The feed receives built parts (the
//! backend, the prompts, the reward function) and its own settings; it never sees the config.

pub mod backend;
pub mod episodes;
pub mod explorer;
pub mod live;
pub mod offline;
pub mod prompts;
pub mod schedule;
pub mod share;
pub mod turns;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use anyhow::Context;
use candle_core::Tensor;
use rlvr_model::Model;

use crate::job::Job;
use crate::store::checkpoint::SourceCursor;
use episodes::{EnvStats, ErrorBudget};
use explorer::{Batch, Explorer};
use offline::OfflineSource;
pub use schedule::{behaviour_version, filter_stale, resampled_steps};
use share::{FromExplorer, Round, RoundLink};

/// Named weights sent from the trainer to the explorer at a sync (checkpoint names).
pub type NamedWeights = Vec<(String, Tensor)>;

/// Where batches come from.
#[allow(clippy::large_enum_variant)]
pub enum Feed {
    /// The explorer on the trainer's thread (o = 0): deterministic and exactly resumable.
    Inline(Box<Explorer>),
    /// An experiences file.
    Offline(OfflineSource),
    /// The explorer on its own thread (o ≥ 1), o batches ahead of the trainer.
    Threaded {
        /// Batches in step order (with a round link, the rounds to gather before each).
        batches: mpsc::Receiver<FromExplorer>,
        /// Weights to the explorer (closed at shutdown).
        weights: Option<mpsc::Sender<WeightsMsg>>,
        /// The explorer thread.
        handle: Option<std::thread::JoinHandle<()>>,
        /// The source cursor after the last batch received.
        last_cursor: SourceCursor,
        /// The job: with several ranks the explorer thread samples this rank's groups only; they
        /// are gathered here, on the run's thread.
        job: Job,
        /// Rollout records kept per step after a gather (`train.log_rollouts`).
        keep: usize,
        /// Batches sampled but not yet handed out, in step order: a resumed checkpoint's buffer,
        /// or the in-flight batches [`Feed::state`] received for a checkpoint. Under data
        /// parallel these are whole batches (gathered), as [`Feed::next`] hands them out.
        pending: VecDeque<Batch>,
        /// The batch last handed out (a copy) with the source cursor before it, kept until its
        /// step completes ([`Feed::completed`]): a save after an error while training that step
        /// (its weights untouched) keeps it in the buffer, as the step before's in-flight batch.
        handed: Option<(Batch, SourceCursor)>,
        /// The sync interval v and offset o.
        sync: (u64, u64),
        /// With v > 1: the last version handed to the explorer (its starting weights, then each
        /// sync's) and a copy of its weights, the one [`Feed::publish`] sends (so the peak memory
        /// is what it was: one copy in flight). A checkpoint between two syncs saves it as the
        /// explorer's weights, so the resumed explorer samples with the version an uninterrupted
        /// one would. `None` with v = 1 (every step is a sync: the explorer's version is the
        /// policy's).
        synced: Option<(u64, Model)>,
        /// The explorer's own weights, shared, when its backend keeps a local model: what a stop
        /// saves instead of waiting for batches sampled by weights the feed no longer keeps
        /// ([`live`]).
        live: Option<live::LiveWeights>,
        /// Data parallel with an environment whose error budget can stop the run
        /// (`env.max_error_frac` < 1): each batch's step once its gathered counts passed the
        /// check. The explorer thread replaces the weights that sampled a batch only after
        /// it ([`spawn_explorer`]), so that when the check stops the run those weights are
        /// still the explorer's, and the save after it keeps them ([`Feed::state`]).
        verdicts: Option<mpsc::Sender<u64>>,
        /// Data parallel: an error every rank met at the same point stopped the run at a
        /// gather (the environment's error budget) or in the explorer (DAPO's short batch with
        /// `train.dynamic_sampling_short_batch = "error"`, decided on the gathered groups).
        stopped_together: bool,
        /// Data parallel with DAPO's dynamic sampling: the gathered rounds back to the explorer
        /// thread ([`RoundLink`]), whose batches then arrive whole. `None` otherwise.
        rounds: Option<mpsc::Sender<Round>>,
        /// Data parallel on servers shared by every rank (vLLM): when the explorer threads take
        /// each version ([`SharedServers`]). `None` otherwise.
        servers: Option<SharedServers>,
    },
}

impl Feed {
    /// The online feed for steps `first_step..=last_step` under sync interval `v` and offset `o`:
    /// `explorer` (its starting weights already loaded) inline when o = 0, else on its own thread.
    /// `job` with the rollout records to keep: with several ranks the inline explorer gathers each
    /// round itself, the threaded one samples its share and [`Feed::next`] gathers on the run's
    /// thread (collectives never leave it).
    ///
    /// `buffered`: a resumed checkpoint's in-flight batches (steps `first_step..`, see
    /// [`Feed::state`]), handed out first; the explorer thread then starts after them (its
    /// weights and cursor are the checkpoint's, which are those the next batch needs).
    /// `synced`: the explorer's starting version and a copy of its weights, kept by the threaded
    /// feed when v > 1 (dropped otherwise) so that a checkpoint before the first sync can save
    /// them.
    ///
    /// # Errors
    /// Dynamic sampling with an explorer thread under data parallel; a buffered batch for another
    /// step than expected.
    pub fn online(
        explorer: Explorer,
        (first_step, last_step): (u64, u64),
        v: u64,
        o: u64,
        (job, keep): (Job, usize),
        buffered: Vec<Batch>,
        synced: Option<(u64, Model)>,
    ) -> anyhow::Result<Feed> {
        let share = |gathers| share::Share {
            job: job.clone(),
            gathers,
        };
        if o == 0 {
            return Ok(Feed::Inline(Box::new(explorer.with_share(share(true))?)));
        }
        let (btx, brx) = mpsc::sync_channel::<FromExplorer>(o.max(1) as usize);
        // DAPO's keep decision needs every rank's groups of each round: the run's thread
        // gathers them for the explorer thread.
        let (explorer, rounds) = match job.is_parallel() && explorer.dynamic_sampling() {
            true => {
                let (tx, rx) = mpsc::channel();
                let link = RoundLink {
                    to_run: btx.clone(),
                    back: rx,
                };
                (explorer.with_round_link(link), Some(tx))
            }
            false => (explorer, None),
        };
        let explorer = explorer.with_share(share(false))?;
        for (i, b) in buffered.iter().enumerate() {
            anyhow::ensure!(
                b.step == first_step + i as u64,
                "the checkpoint's buffer holds the batch of step {} where step {} was expected",
                b.step,
                first_step + i as u64
            );
        }
        let cursor = explorer.cursor();
        let from = first_step + buffered.len() as u64;
        let gate = live::LoadGate::new(explorer.version());
        let live = explorer
            .behaviour_model()
            .cloned()
            .map(|model| live::LiveWeights {
                model,
                gate: gate.clone(),
            });
        let (vtx, vrx) = match job.is_parallel() && explorer.env_budget_can_stop() {
            true => {
                let (tx, rx) = mpsc::channel();
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        // Shared servers: rank 0's explorer thread says when each push is done.
        let (servers, pushed) = match job.is_parallel() && explorer.shared_servers() {
            true => {
                let (tx, rx) = mpsc::channel();
                let (tx, rx) = match job.writer() {
                    true => (Some(tx), Some(rx)),
                    false => (None, None),
                };
                let s = SharedServers {
                    held: VecDeque::new(),
                    gathered: from - 1,
                    pushed: rx,
                    o,
                    last_step,
                };
                (Some(s), tx)
            }
            false => (None, None),
        };
        let (wtx, h) = spawn_explorer(
            explorer,
            (btx, pushed),
            (from, last_step),
            (v, o),
            gate,
            vrx,
        );
        Ok(Feed::Threaded {
            batches: brx,
            weights: Some(wtx),
            handle: Some(h),
            last_cursor: cursor,
            job,
            keep,
            pending: buffered.into(),
            handed: None,
            sync: (v, o),
            synced: synced.filter(|_| v > 1),
            live,
            verdicts: vtx,
            stopped_together: false,
            rounds,
            servers,
        })
    }

    /// The batch of step `t`, or [`Next::Stopped`] when `stop` was set before the explorer
    /// thread's batch was handed out (a Ctrl-C or SIGTERM: the caller stops after the step
    /// before, without waiting for a batch it will not train on), saying how the stop found the
    /// explorer ([`StopFound`]). A batch already received is kept in order for the checkpoint,
    /// which may need it. Without `stop` (data parallel, where every rank must take the same
    /// steps) it waits as long as the explorer takes. The inline explorer and an offline source
    /// never wait on another thread and ignore `stop`.
    ///
    /// # Errors
    /// Sampling, scoring and verifier errors; the explorer thread stopped.
    pub fn next(&mut self, t: u64, stop: Option<&AtomicBool>) -> anyhow::Result<Next> {
        match self {
            Feed::Inline(e) => e.produce(t).map(Next::Batch),
            Feed::Offline(o) => o.produce(t).map(Next::Batch),
            Feed::Threaded {
                batches,
                last_cursor,
                job,
                keep,
                pending,
                handed,
                verdicts,
                stopped_together,
                rounds,
                servers,
                weights,
                ..
            } => {
                if let Some(b) = pending.pop_front() {
                    anyhow::ensure!(
                        b.step == t,
                        "internal: the buffered batch of step {} came out at step {t}",
                        b.step
                    );
                    *handed = Some((b.clone(), *last_cursor));
                    *last_cursor = b.cursor;
                    return Ok(Next::Batch(b));
                }
                // A rank whose explorer failed leaves here; its peers wait in the gather until
                // the launcher ends the job (mpirun does at once) or the timeout names it.
                // Data parallel (no stop flag here): the rounds the explorer sends before the
                // batch are gathered on the way.
                let (got, waited) = match job.is_parallel() {
                    true => {
                        let b = receive_share(batches, job, rounds.as_ref(), stopped_together)?;
                        (Some(b), true)
                    }
                    false => receive_or_stop(batches, stop)?,
                };
                let stopped = stop.is_some_and(|s| s.load(Ordering::SeqCst));
                let b = match got {
                    Some(b) if !stopped => b,
                    // A batch that was ready, or came with the stop (within one poll), is not
                    // trained on either; it is kept in order for the checkpoint, which may
                    // need it.
                    Some(b) => {
                        pending.push_front(b);
                        return Ok(Next::Stopped(StopFound::Ready));
                    }
                    None if waited => return Ok(Next::Stopped(StopFound::Waiting)),
                    None => return Ok(Next::Stopped(StopFound::Sampling)),
                };
                let whole = rounds.is_some();
                let b =
                    gather_checked(job, (*keep, whole), b, verdicts.as_ref(), stopped_together)?;
                if let Some(s) = servers {
                    s.gathered = b.step;
                    s.release(job, weights.as_ref(), batches)?;
                }
                *handed = Some((b.clone(), *last_cursor));
                *last_cursor = b.cursor;
                Ok(Next::Batch(b))
            }
        }
    }

    /// After step `t` completed: the explorer sees the new weights when t is a multiple of v
    /// (paper A, arXiv 2505.22257: the behaviour policy is refreshed every v steps). train.log gets
    /// the sync's time (the whole refresh with the vLLM backend; the hand-over to the explorer's
    /// thread with an offset); an offline source has no explorer and logs nothing.
    ///
    /// # Errors
    /// The backend refused the weights (e.g. a dead vLLM server).
    pub fn publish(&mut self, t: u64, v: u64, model: &Model) -> anyhow::Result<()> {
        if !t.is_multiple_of(v) || matches!(self, Feed::Offline(_)) {
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        self.push(t, model)?;
        crate::log::log_only(&format!(
            "sync: version {t} handed to the explorer in {:.2} s",
            t0.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    fn push(&mut self, t: u64, model: &Model) -> anyhow::Result<()> {
        match self {
            Feed::Inline(e) => e.set_weights(t, &rlvr_rollout::named_tensors(model)),
            Feed::Offline(_) => Ok(()),
            Feed::Threaded {
                weights,
                synced,
                sync: (v, _),
                servers,
                job,
                batches,
                ..
            } => {
                // A copy: the trainer keeps updating its weights while the explorer loads these.
                // With v > 1 the copy is kept until the next sync, for a checkpoint in between
                // (the previous one is dropped first: one copy at a time).
                let w: NamedWeights = if *v > 1 {
                    *synced = None;
                    let copy = model.try_clone()?;
                    let w = rlvr_rollout::named_tensors(&copy);
                    *synced = Some((t, copy));
                    w
                } else {
                    model
                        .named_vars()
                        .into_iter()
                        .map(|(n, v)| Ok((n, v.as_tensor().copy()?)))
                        .collect::<candle_core::Result<_>>()?
                };
                if let Some(s) = servers {
                    // Held until every rank's explorer finished the batches of older versions.
                    s.held.push_back((t, w));
                    return s.release(job, weights.as_ref(), batches);
                }
                if let Some(tx) = weights {
                    // A closed channel means the explorer already finished its last batch.
                    let _ = tx.send((t, w));
                }
                Ok(())
            }
        }
    }

    /// Where the source stands (after the last batch handed out).
    pub fn cursor(&self) -> SourceCursor {
        match self {
            Feed::Inline(e) => e.cursor(),
            Feed::Offline(o) => o.cursor(),
            Feed::Threaded { last_cursor, .. } => *last_cursor,
        }
    }

    /// Where the source stood after the last completed step: [`Feed::cursor`], or with an
    /// explorer thread whose last batch handed out belongs to a step not yet completed, the
    /// cursor before that batch.
    pub fn completed_cursor(&self) -> SourceCursor {
        match self {
            Feed::Threaded {
                handed: Some((_, before)),
                ..
            } => *before,
            _ => self.cursor(),
        }
    }

    /// Step `t`'s update completed: the copy of its batch kept since [`Feed::next`] handed it
    /// out (for a save after an error while training it) is dropped.
    pub fn completed(&mut self, t: u64) {
        if let Feed::Threaded { handed, .. } = self {
            if handed.as_ref().is_some_and(|(b, _)| b.step <= t) {
                *handed = None;
            }
        }
    }

    /// The feed's state for the checkpoint of step `t` (completed; its weights published, or, when
    /// v divides t, perhaps not yet: a resume then makes that sync) of a run
    /// ending at `last_step`: the source cursor, the explorer's version and, when it lags the
    /// policy, its weights, and as `in_flight` says the batches already sampled for the steps after
    /// `t` (`trainer_state/buffer.jsonl`, DESIGN.md section 10; the cursor is then the source's
    /// after the last of them), so a resume trains on them instead of re-sampling them with other
    /// weights. With an explorer thread (o ≥ 1) these are steps t+1..=min(t+o, last_step),
    /// sampled by versions up to t−1; they are received here (waiting for the explorer, whose next
    /// steps need no newer weights) and handed out by [`Feed::next`] as usual. The explorer's
    /// version is the one the step after them needs, s(t+o+1) = v·⌊t/v⌋ (DESIGN.md section 3):
    /// the policy's when v divides t, else the last sync's, whose weights the threaded feed
    /// keeps (`synced`) and the checkpoint saves. Under data parallel every rank gathered its
    /// shares of them first ([`Feed::gather_in_flight`]); a save after an error, which the other
    /// ranks cannot join, keeps none of them. A batch handed out for step t+1 whose update failed
    /// before changing the weights (a save after that error) comes first in the buffer, whatever
    /// else it keeps ([`Feed::completed`]). The buffer holds none of the in-flight batches when
    /// there is nothing in flight (inline, offline), with [`InFlight::Drop`] (a stop that need not
    /// wait, [`Feed::resumes_exactly_without_buffer`]: the resume re-samples them exactly), with
    /// [`InFlight::TryWait`] when the explorer failed or stopped (a save after an error whose
    /// cause was the explorer: it keeps those finished and the explorer's own weights instead
    /// when these let the resume sample the rest exactly, as a stop does with
    /// [`Received::Live`]), and when the explorer after them would need weights the feed no longer
    /// has (the resume then re-samples them with the policy's).
    ///
    /// `stop`: the run's stop flag, watched while waiting for the explorer. Once it is set a wait
    /// that exactness does not need ends ([`Feed::resumes_exactly_without_buffer`]: the buffer is
    /// then empty); one it does need (the batches' weights are gone, e.g. with sync interval 1)
    /// goes on, saying so once (a second signal quits).
    ///
    /// # Errors
    /// With [`InFlight::Wait`], the explorer failed or stopped while sampling one of them; the
    /// explorer's version differs from the policy's but its backend keeps no local weights to
    /// save.
    pub fn state(
        &mut self,
        t: u64,
        last_step: u64,
        in_flight: InFlight,
        stop: Option<&AtomicBool>,
    ) -> anyhow::Result<FeedState<'_>> {
        let received = match in_flight {
            InFlight::Drop => Received::None,
            InFlight::Wait => self.receive_in_flight(t, last_step, stop)?,
            InFlight::TryWait => match self.receive_in_flight(t, last_step, stop) {
                Ok(b) => b,
                Err(e) => match self.hold_after_failure(t, last_step) {
                    Some(h) => {
                        crate::log::log_only(&format!(
                            "note: the explorer failed ({e:#}); the checkpoint of step {t} keeps \
                             the batches it finished and its weights (version {}), with which \
                             the resume samples the rest again, exactly",
                            h.version
                        ));
                        Received::Live(h)
                    }
                    None => {
                        crate::log::log_only(&format!(
                            "note: the checkpoint of step {t} keeps no in-flight batch ({e:#}): \
                             the resume samples them again"
                        ));
                        Received::None
                    }
                },
            },
        };
        let received = match received {
            Received::None if in_flight == InFlight::TryWait && self.stopped_together() => {
                match self.hold_after_failure(t, last_step) {
                    Some(h) => {
                        crate::log::log_only(&format!(
                            "note: every rank stopped at the same batch; the checkpoint of \
                             step {t} keeps the explorer's weights (version {}), with which the \
                             resume samples the failed batch again, exactly",
                            h.version
                        ));
                        Received::Live(h)
                    }
                    None => Received::None,
                }
            }
            r => r,
        };
        let buffered = !matches!(received, Received::None);
        let held = match received {
            Received::Live(h) => Some(h),
            _ => None,
        };
        let mut cursor = self.completed_cursor();
        // The batch of step t+1, handed out before an error while training it, then (when
        // received) those in flight after it.
        let buffer: Vec<&Batch> = match &*self {
            Feed::Threaded {
                pending, handed, ..
            } => {
                let next = handed.as_ref().map(|h| &h.0).filter(|b| b.step == t + 1);
                let rest = pending.iter().filter(|b| buffered && b.step > t);
                next.into_iter().chain(rest).collect()
            }
            _ => Vec::new(),
        };
        if let Some(last) = buffer.last() {
            cursor = last.cursor;
        }
        let first = t + 1 + buffer.len() as u64;
        let (explorer_version, explorer) = match (&held, &*self) {
            (Some(h), Feed::Threaded { live: Some(l), .. }) if h.version != t => {
                (h.version, Some(&l.model))
            }
            (Some(h), _) => (h.version, None),
            (None, _) => self.explorer_state(t, first)?,
        };
        Ok(FeedState {
            cursor,
            explorer_version,
            explorer,
            buffer,
            held,
        })
    }

    /// Data parallel: whether an error every rank meets at the same point stopped the run at a
    /// batch of the explorer thread (the environment's error budget at a gather, DAPO's short
    /// batch in the explorer).
    fn stopped_together(&self) -> bool {
        matches!(
            self,
            Feed::Threaded {
                stopped_together: true,
                ..
            }
        )
    }

    /// Whether a checkpoint of step `t` without the in-flight batches resumes exactly: the
    /// resumed explorer then samples step t+1 first, with version s(t+1), which must be the
    /// policy's or the last sync's (kept). Always for an inline explorer and an offline source;
    /// a stop (Ctrl-C, SIGTERM) waits for the in-flight batches only when this is false.
    pub fn resumes_exactly_without_buffer(&self, t: u64) -> bool {
        match self {
            Feed::Threaded {
                sync: (v, o),
                synced,
                ..
            } => {
                let need = behaviour_version(t + 1, *v, *o);
                need == t || synced.as_ref().is_some_and(|s| s.0 == need)
            }
            _ => true,
        }
    }

    /// The explorer's version and, when it differs from `policy_version`, its weights as a local
    /// model (what a checkpoint must keep to resume sampling exactly). The inline explorer lags
    /// the policy between syncs; the threaded one's resumed explorer first samples step `first`,
    /// which needs version s(first): the last sync's (kept in `synced`) when it is not the
    /// policy's, else the policy's (also the fallback when neither matches: the resume then
    /// re-samples with the policy's weights).
    fn explorer_state(
        &self,
        policy_version: u64,
        first: u64,
    ) -> anyhow::Result<(u64, Option<&Model>)> {
        match self {
            Feed::Inline(e) if e.version() != policy_version => {
                let m = e.behaviour_model().with_context(|| {
                    format!(
                        "the explorer samples with version {} at step {policy_version}, but its \
                         backend keeps no local weights to checkpoint",
                        e.version()
                    )
                })?;
                Ok((e.version(), Some(m)))
            }
            Feed::Threaded {
                synced: Some((version, weights)),
                sync: (v, o),
                ..
            } if *version != policy_version && behaviour_version(first, *v, *o) == *version => {
                Ok((*version, Some(weights)))
            }
            _ => Ok((policy_version, None)),
        }
    }

    /// [`Feed::state`]'s in-flight batches received into `pending`, and whether a buffer applies
    /// (the explorer after them needs the policy's version or the last sync's, which the
    /// checkpoint can then save): [`Received::All`]. [`Received::None`] too when `stop` was set
    /// while waiting and the checkpoint resumes exactly without them. Once `stop` is set and the
    /// batches are needed, it waits no longer than the explorer's own weights make unnecessary:
    /// [`Received::Live`] with the batches finished so far, when the explorer holds the weights
    /// of the first unfinished one and every later batch up to the resumed run's own syncs needs
    /// those or the policy's ([`live`]); otherwise it goes on waiting, saying so once (a second
    /// signal quits).
    fn receive_in_flight(
        &mut self,
        t: u64,
        last_step: u64,
        stop: Option<&AtomicBool>,
    ) -> anyhow::Result<Received> {
        let exact_without = self.resumes_exactly_without_buffer(t);
        let Some(until) = self.in_flight_until(t, last_step) else {
            return Ok(Received::None);
        };
        let base = self.handed_after(t);
        let Feed::Threaded {
            batches,
            job,
            pending,
            sync: (v, o),
            live,
            ..
        } = self
        else {
            return Ok(Received::None);
        };
        let last = |p: &VecDeque<Batch>| p.back().map_or(base, |b| b.step);
        if job.is_parallel() {
            // The shares in flight were gathered on every rank ([`Feed::gather_in_flight`]) or
            // not at all (a save after an error: the other ranks cannot take part).
            return Ok(match last(pending) >= until {
                true => Received::All,
                false => Received::None,
            });
        }
        let (v, o) = (*v, *o);
        let (mut told, mut polls) = (false, 0);
        loop {
            // What is ready, without waiting.
            while last(pending) < until {
                match batches.try_recv() {
                    Ok(m) => pending.push_back(batch_of(m)?),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(e @ mpsc::TryRecvError::Disconnected) => {
                        return Err(anyhow::Error::new(e).context("the explorer thread stopped"))
                    }
                }
            }
            if last(pending) >= until {
                return Ok(Received::All);
            }
            if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
                if exact_without {
                    crate::log::log_only(&format!(
                        "stop: the checkpoint of step {t} does not wait for the explorer's \
                         batches in flight (the resume samples them again, exactly)"
                    ));
                    return Ok(Received::None);
                }
                let first = last(pending) + 1;
                if let Some(h) = live
                    .as_ref()
                    .and_then(|l| live_hold(l, (t, first, until.min(last_step - 1) + 1), (v, o)))
                {
                    let kept = match first - 1 - t {
                        0 => String::new(),
                        1 => format!("the finished batch of step {} and ", t + 1),
                        _ => format!(
                            "the finished batches of steps {}..={} and ",
                            t + 1,
                            first - 1
                        ),
                    };
                    let (left, it) = match until - first {
                        0 => (format!("the batch of step {first}"), "it"),
                        _ => (format!("the batches of steps {first}..={until}"), "them"),
                    };
                    crate::log::log_only(&format!(
                        "stop: the checkpoint of step {t} keeps {kept}the explorer's weights \
                         (version {}) without waiting for {left} in progress (the resume samples \
                         {it} again, exactly)",
                        h.version
                    ));
                    return Ok(Received::Live(h));
                }
                // Said once the wait lasts (a batch about to arrive makes no announcement).
                polls += 1;
                if !told && polls > 2 {
                    told = true;
                    crate::log::say(&format!(
                        "stop: the checkpoint of step {t} waits for the explorer's batches of \
                         steps {first}..={until}, sampled by weights the run no longer keeps, \
                         so that the resume is exact; again to quit now (the resume then \
                         starts from the checkpoint before)"
                    ));
                }
            }
            match batches.recv_timeout(STOP_POLL) {
                Ok(m) => pending.push_back(batch_of(m)?),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(e @ mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(anyhow::Error::new(e).context("the explorer thread stopped"))
                }
            }
        }
    }

    /// The last of the in-flight steps a checkpoint of step `t` (run ending at `last_step`)
    /// keeps, t + o or the last step, when a buffer applies: the explorer after them needs the
    /// policy's version or the last sync's, which the checkpoint can then save. `None` without
    /// an explorer thread, or when the explorer after them would need weights the feed no longer
    /// has (the resume then re-samples them with the policy's).
    fn in_flight_until(&self, t: u64, last_step: u64) -> Option<u64> {
        let Feed::Threaded {
            sync: (v, o),
            synced,
            ..
        } = self
        else {
            return None;
        };
        let until = (t + o).min(last_step);
        let need = behaviour_version(until + 1, *v, *o);
        let kept = need == t || synced.as_ref().map(|s| s.0) == Some(need);
        (until == last_step || kept).then_some(until)
    }

    /// The last step whose batch the feed holds for a checkpoint of step `t` before any in
    /// flight is received: t + 1 when its batch was handed out and its step did not complete (an
    /// error while training it), else `t`.
    fn handed_after(&self, t: u64) -> u64 {
        match self {
            Feed::Threaded {
                handed: Some((b, _)),
                ..
            } if b.step == t + 1 => t + 1,
            _ => t,
        }
    }

    /// After the explorer thread failed (a save after an error, [`InFlight::TryWait`]): its own
    /// weights, held, when they let the checkpoint of step `t` resume exactly with the batches
    /// it finished ([`live_hold`]): a failed thread loads no other weights, so they are still
    /// those of the batch it failed on, unless a load itself failed half way (then `None`).
    /// `None` too under data parallel and without a local model.
    fn hold_after_failure(&self, t: u64, last_step: u64) -> Option<live::Hold> {
        let until = self.in_flight_until(t, last_step)?;
        let base = self.handed_after(t);
        let Feed::Threaded {
            job,
            pending,
            sync: (v, o),
            live: Some(l),
            stopped_together,
            ..
        } = self
        else {
            return None;
        };
        let first = pending.back().map_or(base, |b| b.step) + 1;
        // Data parallel, only after the error budget stopped every rank at a gather, or DAPO's
        // short batch every rank's explorer: the explorer thread then still holds the weights
        // of the batch that failed ([`Feed::next`] held back its next load until the check,
        // [`spawn_explorer`]; a short batch is the explorer's own end).
        if (job.is_parallel() && !*stopped_together) || first > until {
            return None;
        }
        live_hold(l, (t, first, until.min(last_step - 1) + 1), (*v, *o))
    }

    /// Data parallel, before a checkpoint of step `t` that keeps the in-flight batches
    /// ([`InFlight::Wait`]), on every rank together: waits for this rank's shares of the steps
    /// up to [`Feed::in_flight_until`] and gathers each into the whole batch on every rank
    /// (as [`Feed::next`] does), kept in order to be handed out and saved (rank 0 writes them
    /// to `trainer_state/buffer.jsonl`, [`Feed::state`]). Nothing to do in one process (the
    /// checkpoint receives them itself), inline or offline.
    ///
    /// # Errors
    /// The explorer's error (its peers then wait in the gather until the launcher ends the job
    /// or the timeout names it, as in [`Feed::next`]); a failed collective.
    pub fn gather_in_flight(&mut self, t: u64, last_step: u64) -> anyhow::Result<()> {
        let Some(until) = self.in_flight_until(t, last_step) else {
            return Ok(());
        };
        let base = self.handed_after(t);
        let Feed::Threaded {
            batches,
            job,
            keep,
            pending,
            verdicts,
            stopped_together,
            rounds,
            servers,
            weights,
            ..
        } = self
        else {
            return Ok(());
        };
        if !job.is_parallel() {
            return Ok(());
        }
        let whole = rounds.is_some();
        while pending.back().map_or(base, |b| b.step) < until {
            let share = receive_share(batches, job, rounds.as_ref(), stopped_together)?;
            let b = gather_checked(
                job,
                (*keep, whole),
                share,
                verdicts.as_ref(),
                stopped_together,
            )?;
            if let Some(s) = servers.as_mut() {
                s.gathered = b.step;
                s.release(job, weights.as_ref(), batches)?;
            }
            pending.push_back(b);
        }
        Ok(())
    }

    /// Stops the explorer thread, if any (its in-flight batch is dropped). With `wait`, returns
    /// once the thread has ended, which may take the rest of the batch it is sampling (the end
    /// of a run, an error). Without (a stop by a signal, whose process exits next), the thread
    /// is told to end and left to do so: a stop is not held up by a slow or hung sampler or
    /// verifier (in rlvr train the process exits right after, ending it).
    pub fn shutdown(&mut self, wait: bool) {
        if let Feed::Threaded {
            weights,
            handle,
            batches,
            verdicts,
            rounds,
            ..
        } = self
        {
            weights.take();
            verdicts.take();
            // Unblock an explorer waiting for a gathered round.
            rounds.take();
            // Unblock an explorer waiting to send.
            while batches.try_recv().is_ok() {}
            if let Some(h) = handle.take() {
                drop(std::mem::replace(batches, mpsc::sync_channel(0).1));
                if wait || h.is_finished() {
                    let _ = h.join();
                } else {
                    crate::log::log_only(
                        "stop: the explorer thread is still sampling; its batch is dropped \
                         without waiting for it",
                    );
                }
            }
        }
    }
}

/// Data parallel: every rank's share of a batch sampled by the explorer thread, gathered into
/// the whole batch on every rank (experiences and rollout records in rank order, the first `keep`
/// records kept; with `whole` the explorer's rounds were gathered already, [`RoundLink`], and
/// the batch is whole as it came); the environment's counts summed over the ranks onto rank 0's copy (the
/// others' zero), so that the run's own sum over the ranks ([`env_over_ranks`]) gives the whole
/// batch's whichever rank's copy a checkpoint saves, and `env.max_error_frac` checked on those
/// sums ([`Batch::env_check`]; the same decision on every rank). One process: `b`.
///
/// # Errors
/// A failed collective; more than `env.max_error_frac` of the whole batch's episodes failed
/// ([`episodes::ErrorBudgetExceeded`], on every rank).
fn gather_batch(
    job: &mut Job,
    (keep, whole): (usize, bool),
    mut b: Batch,
) -> anyhow::Result<Batch> {
    if !job.is_parallel() {
        return Ok(b);
    }
    if !whole {
        let rows = vec![std::mem::take(&mut b.experiences)];
        let recs = std::mem::take(&mut b.rollouts);
        let (all, all_recs) = job.gather_round(rows, recs)?;
        b.experiences = all.into_iter().flatten().collect();
        b.rollouts = all_recs.into_iter().take(keep).collect();
    }
    if let Some(e) = b.env.take() {
        let total = env_over_ranks(job, &e)?;
        if let Some(c) = b.env_check.take() {
            let mine = ErrorBudget {
                errors: e.errors,
                episodes: e.episodes,
                first: c.first,
            };
            check_over_ranks(job, mine, c.max_error_frac)?;
        }
        b.env = Some(if job.writer() {
            total
        } else {
            Default::default()
        });
    }
    Ok(b)
}

/// [`gather_batch`], then the explorer thread told that the batch passed the error budget
/// (`verdicts`, [`spawn_explorer`]), or `failed` set when the budget stopped the run.
///
/// # Errors
/// As [`gather_batch`].
fn gather_checked(
    job: &mut Job,
    keep: (usize, bool),
    b: Batch,
    verdicts: Option<&mpsc::Sender<u64>>,
    failed: &mut bool,
) -> anyhow::Result<Batch> {
    match gather_batch(job, keep, b) {
        Ok(b) => {
            if let Some(v) = verdicts {
                // A closed channel: the explorer thread already ended.
                let _ = v.send(b.step);
            }
            Ok(b)
        }
        Err(e) => {
            *failed |= e.chain().any(|c| c.is::<episodes::ErrorBudgetExceeded>());
            Err(e)
        }
    }
}

/// `env.max_error_frac` on the whole request batch from every rank's `mine` (its share's failed
/// and run episodes, its first failure): the counts summed over the ranks (exact in f64, as in
/// [`env_over_ranks`]), so every rank takes the same decision, the one a single process takes
/// on the whole batch; when it stops, the first failure is the first rank's that has one (the
/// shares are consecutive in rank order, so it is the one a single process names). One process:
/// `mine`'s own check. Every rank calls it at the same point.
///
/// # Errors
/// The budget is exceeded ([`episodes::ErrorBudgetExceeded`], the same on every rank); a failed
/// collective.
pub(crate) fn check_over_ranks(
    job: &mut Job,
    mine: ErrorBudget,
    max_error_frac: f64,
) -> anyhow::Result<()> {
    if !job.is_parallel() {
        return Ok(mine.check(max_error_frac)?);
    }
    let mut counts = [mine.errors as f64, mine.episodes as f64];
    job.sum_f64(&mut counts)?;
    let whole = ErrorBudget {
        errors: counts[0] as usize,
        episodes: counts[1] as usize,
        first: None,
    };
    if whole.check(max_error_frac).is_ok() {
        return Ok(());
    }
    let first = job.first_in_rank_order(mine.first)?;
    Ok(ErrorBudget { first, ..whole }.check(max_error_frac)?)
}

/// What the environment did for the whole batch from every rank's `e` (its share of the
/// episodes): the counts (episodes, errors, tool calls, tool-call errors, ends, restarts,
/// replays, truncations) summed over the ranks (whole numbers below 2^53: exact in f64, whatever
/// order the collective adds them in), `env_s` the slowest rank's. One process: `e`.
///
/// # Errors
/// A failed collective.
pub(crate) fn env_over_ranks(job: &mut Job, e: &EnvStats) -> anyhow::Result<EnvStats> {
    if !job.is_parallel() {
        return Ok(e.clone());
    }
    let n = &e.ends;
    let mut counts = [
        e.episodes as f64,
        e.errors as f64,
        e.tool_calls as f64,
        e.tool_call_errors as f64,
        n.done as f64,
        n.max_turns as f64,
        n.length as f64,
        n.budget as f64,
        n.eos as f64,
        e.restarts as f64,
        e.replayed as f64,
        e.obs_truncated as f64,
        e.closed as f64,
    ];
    job.sum_f64(&mut counts)?;
    let mut secs = [e.env_s];
    job.max_f64(&mut secs)?;
    let c = counts.map(|x| x as usize);
    Ok(EnvStats {
        episodes: c[0],
        errors: c[1],
        tool_calls: c[2],
        tool_call_errors: c[3],
        env_s: secs[0],
        ends: episodes::EndCounts {
            done: c[4],
            max_turns: c[5],
            length: c[6],
            budget: c[7],
            eos: c[8],
        },
        restarts: c[9],
        replayed: c[10],
        obs_truncated: c[11],
        closed: c[12],
    })
}

/// One process: the batch (or the error) a message of the explorer thread carries; a round to
/// gather is never sent without several ranks.
///
/// # Errors
/// The explorer's error; a round (an internal error).
fn batch_of(m: FromExplorer) -> anyhow::Result<Batch> {
    match m {
        FromExplorer::Batch(b) => b,
        FromExplorer::Round(_) => {
            anyhow::bail!("internal: a sampling round to gather in a run of one process")
        }
    }
}

/// Data parallel, on the run's thread: this rank's share of the explorer thread's next batch
/// (whole with a round link), gathering on the way every round the explorer sends before it
/// ([`RoundLink`]: `env.max_error_frac` checked on the round's counts summed over the ranks
/// first, as the explorer on the run's thread checks it, then the round gathered in rank order
/// and sent `back`). Every rank's explorer sends the same sequence (its decisions are taken on
/// the gathered rounds), so the ranks meet in the same collectives. `together` is set when the
/// error is one every rank meets here (the budget, or the explorer's
/// [`explorer::ShortBatchStop`]).
///
/// # Errors
/// The explorer's error; the error budget exceeded; a failed collective; the explorer thread
/// stopped.
fn receive_share(
    batches: &mpsc::Receiver<FromExplorer>,
    job: &mut Job,
    back: Option<&mpsc::Sender<Round>>,
    together: &mut bool,
) -> anyhow::Result<Batch> {
    loop {
        match batches.recv().context("the explorer thread stopped")? {
            FromExplorer::Batch(Ok(b)) => return Ok(b),
            FromExplorer::Batch(Err(e)) => {
                *together |= e.chain().any(|c| c.is::<explorer::ShortBatchStop>());
                return Err(e);
            }
            FromExplorer::Round(r) => {
                if let Some((mine, max_error_frac)) = r.budget {
                    if let Err(e) = check_over_ranks(job, mine, max_error_frac) {
                        *together |= e.chain().any(|c| c.is::<episodes::ErrorBudgetExceeded>());
                        return Err(e);
                    }
                }
                let (groups, recs) = r.round;
                let whole = job.gather_round(groups, recs)?;
                if let Some(back) = back {
                    // A closed channel: the explorer thread already ended.
                    let _ = back.send(whole);
                }
            }
        }
    }
}

/// How often a wait for the explorer thread looks at the stop flag ([`Feed::next`]).
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// The explorer thread's next batch, and whether the call waited for it. Once `stop` is set
/// (checked before waiting and every [`STOP_POLL`] while waiting) it returns what the channel
/// already holds without waiting: `(Some(batch), _)` when the batch was ready, `(None, true)`
/// when the stop came during the wait, `(None, false)` when it was set before it (the explorer
/// still sampling). Without `stop`, waits for the batch however long it takes.
///
/// # Errors
/// The explorer's error; the explorer thread stopped (while waiting: a thread that ended after
/// a stop yields no batch).
fn receive_or_stop(
    batches: &mpsc::Receiver<FromExplorer>,
    stop: Option<&AtomicBool>,
) -> anyhow::Result<(Option<Batch>, bool)> {
    let Some(stop) = stop else {
        let m = batches.recv().context("the explorer thread stopped")?;
        return Ok((Some(batch_of(m)?), true));
    };
    let mut waited = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            return match batches.try_recv() {
                Ok(m) => Ok((Some(batch_of(m)?), waited)),
                Err(_) => Ok((None, waited)),
            };
        }
        match batches.recv_timeout(STOP_POLL) {
            Ok(m) => return Ok((Some(batch_of(m)?), waited)),
            Err(mpsc::RecvTimeoutError::Timeout) => waited = true,
            Err(e @ mpsc::RecvTimeoutError::Disconnected) => {
                return Err(anyhow::Error::new(e).context("the explorer thread stopped"))
            }
        }
    }
}

/// What [`Feed::next`] gives for a step (returned once a step and taken apart at once: the
/// batch is not boxed).
#[allow(clippy::large_enum_variant)]
pub enum Next {
    /// The step's batch.
    Batch(Batch),
    /// The stop flag was set before the batch was handed out: the step does not run.
    Stopped(StopFound),
}

/// Where a stop found the explorer thread's batch for the step ([`Feed::next`]), for the
/// message that says what happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopFound {
    /// The step was waiting for the batch (the explorer sampling or scoring it) when the stop
    /// came.
    Waiting,
    /// The batch was ready (sampled before the step began, or arriving with the stop): it is not
    /// trained on, and kept for the checkpoint in case the resume needs it.
    Ready,
    /// The stop came before the step began waiting (during the step before's sync or report),
    /// while the explorer was still sampling the batch: nothing waited for it.
    Sampling,
}

/// What a checkpoint does with the batches an explorer thread already sampled for the steps after
/// it ([`Feed::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// Keeps none: the resume samples them again, with the weights they need (a stop for which
    /// [`Feed::resumes_exactly_without_buffer`] holds).
    Drop,
    /// Waits for them and keeps them; the explorer's error is the checkpoint's.
    Wait,
    /// As `Wait`, but an explorer that failed or stopped leaves the buffer empty (noted in
    /// train.log) instead of failing the checkpoint: the save after an error, whose cause may be
    /// the explorer itself.
    TryWait,
}

/// What [`Feed::state`] received of the batches in flight.
enum Received {
    /// None kept: the resume samples them again.
    None,
    /// Every one of them (`pending`).
    All,
    /// Those finished (`pending`) and the explorer's weights for the rest, held still.
    Live(live::Hold),
}

/// Holds the explorer's weights ([`live::LoadGate::hold`]) when they let a checkpoint of step `t`
/// with the batches before step `first` resume exactly: the explorer holds version s(first), and
/// every step from `first` to `next` (the first the resumed run's own syncs serve, or the last
/// step) needs that version or the policy's, t (which the resume hands over first). `None`, and
/// nothing held, otherwise (the explorer has not loaded s(first) yet, a load of its failed, or a
/// batch in between needs a version that neither the explorer nor the checkpoint has).
fn live_hold(
    live: &live::LiveWeights,
    (t, first, next): (u64, u64, u64),
    (v, o): (u64, u64),
) -> Option<live::Hold> {
    let need = behaviour_version(first, v, o);
    let served = (first..=next).all(|j| {
        let s = behaviour_version(j, v, o);
        s == need || s == t
    });
    if !served {
        return None;
    }
    let h = live.gate.hold();
    (h.intact && h.version == need).then_some(h)
}

/// The feed's part of a checkpoint ([`Feed::state`]): where the source stands, the explorer's
/// version and weights, and the batches in flight. A resume builds the feed from it
/// ([`Feed::online`]'s `buffered`, the explorer's cursor and weights) because the explorer thread
/// starts from it.
pub struct FeedState<'a> {
    /// The source cursor after the checkpoint's step (after the last in-flight batch, if any).
    pub cursor: SourceCursor,
    /// The policy version the explorer samples with.
    pub explorer_version: u64,
    /// The explorer's weights, when its version differs from the policy's.
    pub explorer: Option<&'a Model>,
    /// The in-flight batches, in step order.
    pub buffer: Vec<&'a Batch>,
    /// When `explorer` is the explorer thread's own model ([`live`]): keeps the explorer from
    /// loading other weights into it until this record (the checkpoint) is dropped.
    pub held: Option<live::Hold>,
}

/// Data parallel with an explorer thread on servers every rank samples from, which rank 0 alone
/// loads each version into (the vLLM backend: rank 0 writes and pushes, the others follow).
/// One process samples batch j with version s(j) = v·⌊(j−1−o)/v⌋ (DESIGN.md section 3), so the
/// first batch of version u (a multiple of v) is u+o+1, and every batch up to u+o samples older
/// weights. Here the run's threads, through collectives (MPI is initialised
/// `MPI_THREAD_SERIALIZED`: collectives never leave the run's thread), order each version's
/// load against every rank's sampling:
/// 1. version u, published at the sync after step u, is held until the batch of step u+o is
///    gathered (every rank's explorer finished its share of every batch of older versions; no
///    explorer can start batch u+o+1, which waits for version u);
/// 2. then rank 0 hands it to its explorer thread, which pushes it to the servers, and waits
///    until the push is done ([`SharedServers::pushed`]);
/// 3. every rank learns at one collective (rank 0's flag: the push failed) that it is done, and
///    only then the other ranks hand the version to their explorers.
///
/// The explorers sample batch u+o+1 while the trainers train step u+o: sampling still overlaps
/// training between syncs; the push itself is on the run's path of rank 0 (as with sync offset
/// 0). A version no batch of the run samples with (u+o ≥ the last step) is dropped. The batches
/// are those one process samples: each is sampled by its version s(j), whatever the timing.
pub struct SharedServers {
    /// Versions published at a sync (with their weights), in order, not yet handed to the
    /// explorer thread.
    held: VecDeque<WeightsMsg>,
    /// The last step whose batch was gathered (every rank finished sampling its share).
    gathered: u64,
    /// Rank 0: whether each load of its explorer thread (a push to the servers) succeeded.
    pushed: Option<mpsc::Receiver<bool>>,
    /// The sync offset o.
    o: u64,
    /// The run's last step.
    last_step: u64,
}

impl SharedServers {
    /// Hands the explorer thread (`weights`) every held version whose older batches every rank
    /// finished, in order, as the type docs say: rank 0 first, waiting for its push, then the
    /// other ranks. Every rank calls it at the same points (after each gather and each sync),
    /// with the same state, so they meet in the same collectives.
    ///
    /// # Errors
    /// Rank 0's push failed (on rank 0 its explorer's error, from `batches`; on the others one
    /// that names rank 0): every rank stops here; a failed collective.
    fn release(
        &mut self,
        job: &mut Job,
        weights: Option<&mpsc::Sender<WeightsMsg>>,
        batches: &mpsc::Receiver<FromExplorer>,
    ) -> anyhow::Result<()> {
        while self
            .held
            .front()
            .is_some_and(|(u, _)| u + self.o <= self.gathered)
        {
            let (u, w) = self.held.pop_front().expect("a held version");
            // No batch of this run samples with version u: its explorer thread ends first.
            if u + self.o >= self.last_step {
                continue;
            }
            let (ok, w) = match &self.pushed {
                Some(pushed) => {
                    if let Some(tx) = weights {
                        let _ = tx.send((u, w));
                    }
                    (pushed.recv().unwrap_or(false), None)
                }
                None => (true, Some(w)),
            };
            if job.any(!ok)? {
                if self.pushed.is_some() {
                    let e = match batches.recv() {
                        Ok(FromExplorer::Batch(Err(e))) => e,
                        _ => anyhow::anyhow!("the explorer thread stopped"),
                    };
                    return Err(e.context(format!(
                        "loading version {u} into the servers every rank samples from"
                    )));
                }
                anyhow::bail!(
                    "rank 0 could not load version {u} into the servers every rank samples \
                     from (its error is in train.log): no rank samples from them"
                );
            }
            if let (Some(w), Some(tx)) = (w, weights) {
                // A closed channel: the explorer thread already ended.
                let _ = tx.send((u, w));
            }
        }
        Ok(())
    }
}

/// A weight sync to the explorer thread: the version and its weights.
pub type WeightsMsg = (u64, NamedWeights);
type ExplorerThread = (mpsc::Sender<WeightsMsg>, std::thread::JoinHandle<()>);

/// The explorer thread of o ≥ 1: batch t waits for version s(t). With `verdicts` (data parallel,
/// an error budget that can stop the run: [`Feed::Threaded`]'s `verdicts`) it replaces its
/// weights only once the run's thread has checked every batch it sampled with them, so that the
/// weights of a batch that stops the run are still its own for the save after the error (the
/// one-process explorer, which checks its batches itself, stops at once and loads nothing).
fn spawn_explorer(
    mut ex: Explorer,
    (btx, pushed): (mpsc::SyncSender<FromExplorer>, Option<mpsc::Sender<bool>>),
    (first_step, last_step): (u64, u64),
    (v, o): (u64, u64),
    gate: std::sync::Arc<live::LoadGate>,
    verdicts: Option<mpsc::Receiver<u64>>,
) -> ExplorerThread {
    let (wtx, wrx) = mpsc::channel::<WeightsMsg>();
    // No CUDA-graph capture anywhere while this thread may queue work on the GPU's one stream
    // beside the trainer's (an evaluation's decode would record it; rlvr_rollout::CaptureBlock).
    let block = rlvr_rollout::CaptureBlock::hold();
    let handle = std::thread::spawn(move || {
        let _block = block;
        // The last batch sampled here and the last the run's thread checked.
        let (mut produced, mut checked) = (first_step - 1, first_step - 1);
        for t in first_step..=last_step {
            let need = behaviour_version(t, v, o);
            while ex.version() < need {
                if let Some(verdicts) = &verdicts {
                    while checked < produced {
                        let Ok(s) = verdicts.recv() else { return };
                        checked = checked.max(s);
                    }
                }
                let Ok((ver, w)) = wrx.recv() else { return };
                // Not while a checkpoint saves the weights being replaced ([`live`]).
                let loaded = gate.load(|| {
                    ex.set_weights(ver, &w)?;
                    Ok(ex.version())
                });
                // Rank 0 on shared servers: the run's thread waits for this before the other
                // ranks take the version ([`SharedServers`]).
                if let Some(p) = &pushed {
                    let _ = p.send(loaded.is_ok());
                }
                if let Err(e) = loaded {
                    let _ = btx.send(FromExplorer::Batch(Err(e)));
                    return;
                }
            }
            let r = ex.produce(t);
            produced = t;
            let failed = r.is_err();
            if btx.send(FromExplorer::Batch(r)).is_err() || failed {
                return;
            }
        }
    });
    (wtx, handle)
}
