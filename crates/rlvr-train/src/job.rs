//! The job this process is part of: one process (world size 1) or one rank of a data-parallel run
//! (ARCHITECTURE.md, "Data parallel"). A [`Job`] is always present: at world size 1 it holds
//! rlvr-dist's [`LocalComm`] and every method below is the one-process behaviour (no collective,
//! the value itself), so the stages take a `Job` and never an `Option` of a communicator.
//!
//! What lives here: the launch shared by `rlvr train` and `rlvr sft` ([`Job::launch`]); which
//! rank writes ([`Job::writer`]); "rank 0 decides and tells the others" ([`Job::rank0_tries`],
//! [`Job::rank0_says`]); the step's small collectives (a stop vote, the slowest rank's timings, a
//! barrier at a sync); a rank's share of a batch ([`Job::my_rows`], [`Job::my_range`]); the
//! gathers of rows ([`Job::gather_round`], [`Job::gather_view`]) over the one binary row codec
//! ([`crate::store::wire`]); and how a failed rank leaves ([`Job::leave_on_error`]).
//!
//! Invariant: at world size 1 nothing here communicates, and every method returns what the
//! one-process code computed before the job existed (`tests/it/job.rs`); at world size > 1 every
//! rank calls the same methods in the same order.

use std::borrow::Cow;
use std::ops::Range;
use std::time::Duration;

use anyhow::bail;
use rlvr_dist::env::Launch;
use rlvr_dist::{Communicator, LocalComm, Op, SharedComm};

use crate::store::experience::Experience;
use crate::store::rollouts::RolloutRecord;
use crate::store::wire::{self, RowMeta};

/// This process's place in its job: the communicator (shared by the stages that call collectives
/// and the optimizer's gradient reduction), its rank and the world size. Cheap to clone: clones
/// share the communicator.
#[derive(Clone)]
pub struct Job {
    comm: SharedComm,
    /// The launcher's view of this process (local rank included).
    launch: Launch,
}

/// The step batch as every rank sees it: all rows' [`RowMeta`] in global order (rank 0's first),
/// and where this rank's rows sit in it ([`Job::gather_view`]).
#[derive(Debug, Clone)]
pub struct GlobalView {
    /// Every row of the step, rank 0's first.
    pub rows: Vec<RowMeta>,
    /// Global index of this rank's first row.
    pub offset: usize,
    /// This rank's rows.
    pub local: usize,
}

impl GlobalView {
    /// The global index of local row `i`.
    pub fn global(&self, i: usize) -> usize {
        self.offset + i
    }

    /// The local index of global row `g`, when this rank holds it.
    pub fn local_index(&self, g: usize) -> Option<usize> {
        (g >= self.offset && g < self.offset + self.local).then(|| g - self.offset)
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Job(rank {} of {})", self.rank(), self.world())
    }
}

impl Default for Job {
    fn default() -> Self {
        Job::single()
    }
}

impl Job {
    /// One process: rank 0 of a world of 1, over [`LocalComm`].
    pub fn single() -> Job {
        Job {
            comm: SharedComm::new(Box::new(LocalComm)),
            launch: Launch::single(),
        }
    }

    /// A job over `comm` (tests: a [`rlvr_dist::ThreadComm`] rank; [`Job::launch`] otherwise);
    /// no local rank is known.
    pub fn over(comm: SharedComm) -> Job {
        let launch = Launch {
            rank: comm.rank(),
            world_size: comm.world_size(),
            local_rank: None,
            local_world_size: None,
            source: rlvr_dist::env::Source::Default,
        };
        Job { comm, launch }
    }

    /// The launch of `rlvr train` and `rlvr sft`: rank and world size from the launcher's
    /// environment (`mpirun`, `srun --mpi=pmix`, torchrun: [`rlvr_dist::env::from_process_env`]).
    /// One process with a host `backend` is [`Job::single`] and keeps `device` as it is.
    /// Otherwise `device` becomes the rank's (`cuda` → `cuda:{local rank}`,
    /// [`rlvr_dist::env::device_for`]), that device is opened first (NCCL then runs on the stream
    /// of the kernels that write the gradients) and the communicator made with `timeout`; the
    /// second value is the rank's device when it was rewritten (`None`: as given). A world of 1
    /// (NCCL asked for in one process) is still a job of one process. `timeout` (the
    /// collectives' limit, `distributed.timeout_s`) is only asked for when a communicator is made.
    ///
    /// # Errors
    /// A launcher environment that contradicts itself; a world size above 1 in a build without
    /// the `mpi` feature; a device that cannot be opened; the communicator's initialisation.
    pub fn launch(
        device: &str,
        backend: rlvr_dist::Backend,
        timeout: impl FnOnce() -> anyhow::Result<Option<Duration>>,
    ) -> anyhow::Result<(Job, Option<String>)> {
        let launch = rlvr_dist::env::from_process_env()?;
        if launch.world_size == 1 && backend != rlvr_dist::Backend::Nccl {
            return Ok((
                Job {
                    launch,
                    ..Job::single()
                },
                None,
            ));
        }
        let timeout = timeout()?;
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let mine = rlvr_dist::env::device_for(device, &launch, visible.as_deref())?;
        // The same device the model will be loaded on (rlvr-model opens each GPU once).
        let dev = rlvr_model::parse_device(&mine)
            .map_err(|e| anyhow::anyhow!("device {mine:?} for rank {}: {e}", launch.rank))?;
        let comm = rlvr_dist::init_on(&launch, timeout, backend, &dev)?;
        let comm = match comm.world_size() {
            1 => SharedComm::new(Box::new(LocalComm)),
            _ => SharedComm::new(comm),
        };
        Ok((Job { comm, launch }, Some(mine)))
    }

    /// The launcher's view of this process ([`Launch`]).
    pub fn launched(&self) -> &Launch {
        &self.launch
    }

    /// The device `spec` names for this rank (`cuda` → `cuda:{local rank}`, within
    /// `CUDA_VISIBLE_DEVICES`: [`rlvr_dist::env::device_for`]).
    ///
    /// # Errors
    /// A spec the launch cannot place (e.g. `cuda` without a local rank).
    pub fn device(&self, spec: &str) -> anyhow::Result<String> {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        Ok(rlvr_dist::env::device_for(
            spec,
            &self.launch,
            visible.as_deref(),
        )?)
    }

    /// This rank, `0..world()`.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Ranks in the job (1: one process).
    pub fn world(&self) -> usize {
        self.comm.world_size()
    }

    /// Whether there is more than one rank.
    pub fn is_parallel(&self) -> bool {
        self.world() > 1
    }

    /// Whether this process writes the run directory (one process, or rank 0).
    pub fn writer(&self) -> bool {
        self.rank() == 0
    }

    /// The communicator (for the optimizer's gradient reduction, `rlvr_dist::DistReduce`).
    pub fn comm(&self) -> SharedComm {
        self.comm.clone()
    }

    /// Time spent inside collectives so far (`time/comm_s` is its growth over a step); `None` in
    /// one process, which has no collectives.
    pub fn busy(&self) -> Option<Duration> {
        self.is_parallel().then(|| self.comm.busy())
    }

    /// Rank 0 runs `f`, then tells the others whether it succeeded (one `any`). Rank 0 gets `f`'s
    /// result (`Some` of its value, or its error); another rank gets `Ok(None)` when rank 0
    /// succeeded, else an error saying that rank 0 could not `what` (rank 0's own error says
    /// why). One process: `f`'s result.
    ///
    /// # Errors
    /// `f`'s error on rank 0; rank 0's failure on the others; a failed collective.
    pub fn rank0_tries<T>(
        &mut self,
        what: &str,
        f: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<Option<T>> {
        if !self.is_parallel() {
            return f().map(Some);
        }
        if self.writer() {
            let r = f();
            self.comm.any(r.is_err())?;
            r.map(Some)
        } else {
            if self.comm.any(false)? {
                bail!("rank 0 could not {what} (its error says why)");
            }
            Ok(None)
        }
    }

    /// Rank 0's `bytes` on every rank (one `broadcast_bytes`; the others' values are ignored).
    /// One process: `bytes`.
    ///
    /// # Errors
    /// A failed collective.
    pub fn rank0_says(&mut self, mut bytes: Vec<u8>) -> anyhow::Result<Vec<u8>> {
        if self.is_parallel() {
            self.comm.broadcast_bytes(&mut bytes, 0)?;
        }
        Ok(bytes)
    }

    /// Whether `flag` is set on any rank (a stop asked of one rank stops all). One process:
    /// `flag`.
    ///
    /// # Errors
    /// A failed collective.
    pub fn any(&mut self, flag: bool) -> anyhow::Result<bool> {
        if !self.is_parallel() {
            return Ok(flag);
        }
        Ok(self.comm.any(flag)?)
    }

    /// The first `Some` of every rank's `mine`, in rank order (one `all_gather_bytes`; every
    /// rank gets the same). One process: `mine`.
    ///
    /// # Errors
    /// A failed collective; a message that is not UTF-8 (names the rank).
    pub fn first_in_rank_order(&mut self, mine: Option<String>) -> anyhow::Result<Option<String>> {
        if !self.is_parallel() {
            return Ok(mine);
        }
        // A leading byte tells `None` from `Some("")`.
        let bytes = match mine {
            None => vec![0],
            Some(m) => std::iter::once(1).chain(m.into_bytes()).collect(),
        };
        for (rank, part) in self.comm.all_gather_bytes(&bytes)?.into_iter().enumerate() {
            if part.first() == Some(&1) {
                let text = String::from_utf8(part[1..].to_vec())
                    .map_err(|e| anyhow::anyhow!("rank {rank}'s message: {e}"))?;
                return Ok(Some(text));
            }
        }
        Ok(None)
    }

    /// Each value's maximum over the ranks, in place (a step waits for its slowest rank).
    ///
    /// # Errors
    /// A failed collective.
    pub fn max_f64(&mut self, xs: &mut [f64]) -> anyhow::Result<()> {
        self.reduce_f64(xs, Op::Max)
    }

    /// Each value's sum over the ranks, in place.
    ///
    /// # Errors
    /// A failed collective.
    pub fn sum_f64(&mut self, xs: &mut [f64]) -> anyhow::Result<()> {
        self.reduce_f64(xs, Op::Sum)
    }

    fn reduce_f64(&mut self, xs: &mut [f64], op: Op) -> anyhow::Result<()> {
        if self.is_parallel() {
            self.comm.all_reduce_f64(xs, op)?;
        }
        Ok(())
    }

    /// Waits for every rank (after a sync: nobody samples until every rank loaded the version).
    ///
    /// # Errors
    /// A failed collective.
    pub fn barrier(&mut self) -> anyhow::Result<()> {
        if self.is_parallel() {
            self.comm.barrier()?;
        }
        Ok(())
    }

    /// This rank's consecutive share of `n` items ([`crate::pack::rank_range`]); `0..n` in one
    /// process.
    pub fn my_range(&self, n: usize) -> Range<usize> {
        crate::pack::rank_range(n, self.rank(), self.world())
    }

    /// This rank's whole groups of a step batch ([`crate::pack::rank_rows`]); in one process the
    /// batch itself, unchanged (borrowed).
    pub fn my_rows<'a>(&self, batch: &'a [Experience]) -> Cow<'a, [Experience]> {
        match self.is_parallel() {
            true => Cow::Owned(crate::pack::rank_rows(batch, self.rank(), self.world())),
            false => Cow::Borrowed(batch),
        }
    }

    /// Every rank's groups and rollout records of one sampling round, gathered in rank order
    /// (one `all_gather_bytes` of [`wire`]'s encoding). One process: the inputs.
    ///
    /// # Errors
    /// A failed collective; a malformed message (names the rank).
    pub fn gather_round(
        &mut self,
        groups: Vec<Vec<Experience>>,
        rollouts: Vec<RolloutRecord>,
    ) -> anyhow::Result<(Vec<Vec<Experience>>, Vec<RolloutRecord>)> {
        if !self.is_parallel() {
            return Ok((groups, rollouts));
        }
        let parts = self
            .comm
            .all_gather_bytes(&wire::encode_round(&groups, &rollouts))?;
        let (mut all_groups, mut all_rollouts) = (Vec::new(), Vec::new());
        for (rank, bytes) in parts.iter().enumerate() {
            let (g, r) = wire::decode_round(bytes)
                .map_err(|e| anyhow::anyhow!("rank {rank}'s sampled groups: {e}"))?;
            all_groups.extend(g);
            all_rollouts.extend(r);
        }
        Ok((all_groups, all_rollouts))
    }

    /// What the advantages and normalisers need of every rank's rows of the step (one
    /// `all_gather_bytes` of their [`RowMeta`]); in one process, `batch`'s own.
    ///
    /// # Errors
    /// A failed collective; a malformed message; a group id held by two ranks (groups must not
    /// be split across ranks: their advantages would need communication).
    pub fn gather_view(&mut self, batch: &[Experience]) -> anyhow::Result<GlobalView> {
        let local: Vec<RowMeta> = batch.iter().map(RowMeta::of).collect();
        if !self.is_parallel() {
            return Ok(GlobalView {
                rows: local,
                offset: 0,
                local: batch.len(),
            });
        }
        let parts = self.comm.all_gather_bytes(&wire::encode_metas(&local))?;
        let mut rows = Vec::new();
        let mut offset = 0;
        let mut seen = std::collections::HashSet::new();
        for (r, bytes) in parts.iter().enumerate() {
            if r == self.rank() {
                offset = rows.len();
            }
            let mine =
                wire::decode_metas(bytes).map_err(|e| anyhow::anyhow!("rank {r}'s rows: {e}"))?;
            let groups: std::collections::HashSet<&str> =
                mine.iter().map(|m| m.group_id.as_str()).collect();
            for g in groups {
                anyhow::ensure!(
                    seen.insert(g.to_string()),
                    "group {g:?} has rows on rank {r} and on a lower rank: a group must be on one \
                     rank"
                );
            }
            rows.extend(mine);
        }
        Ok(GlobalView {
            rows,
            offset,
            local: batch.len(),
        })
    }

    /// On a rank of a job of separate processes ([`Communicator::separate_processes`]), an error
    /// ends this process at once, without finalising MPI: the launcher then ends the other ranks,
    /// naming this one (`mpirun` does), where finalising would leave them waiting in their next
    /// collective until `distributed.timeout_s` and then abort (and Open MPI's `mpirun` can
    /// outlive ranks that aborted after one finalised). The error is printed as `rlvr` prints any
    /// (what the run saved is saved by then). Otherwise (one process included) returns `res`.
    pub fn leave_on_error<T>(&self, res: anyhow::Result<T>) -> anyhow::Result<T> {
        match res {
            Err(e) if self.is_parallel() && self.comm.separate_processes() => {
                let (r, w) = (self.rank(), self.world());
                rlvr_dist::comm::say_whole(&format!(
                    "error: {e:#}\nrlvr: rank {r} of {w} failed; it leaves the job without \
                     finalising MPI, so that the launcher ends the other ranks now"
                ));
                rlvr_reward::external::kill_all_groups();
                std::process::exit(1);
            }
            res => res,
        }
    }
}
