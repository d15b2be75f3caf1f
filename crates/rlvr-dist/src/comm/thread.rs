//! [`ThreadComm`]: N ranks as N threads of one process (a test double).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use candle_core::Tensor;

use super::{
    check_gather_shape, check_root, check_scatter_shape, Communicator, Op, DEFAULT_TIMEOUT,
};
use crate::buf::{check_copyable, check_reducible, with_slice, HostVec, Wide};
use crate::{DistError, Result};

/// One rank of an in-process group of threads, for tests: plain `cargo test` covers
/// data-parallel logic with it, no MPI needed. It is never offered to users.
///
/// Built on `std::sync` only: each collective is an exchange in which every rank deposits its
/// contribution (a copy of its data) in a shared slot, the last to arrive publishes the list, and
/// every rank computes its result from it in rank order. Sums are therefore `((x₀+x₁)+x₂)+…`,
/// identical on every rank, and bitwise equal to any engine's at two ranks.
///
/// Unlike MPI it checks, at every collective, that all ranks called the same collective with the
/// same layout ([`DistError::Mismatch`] otherwise). A rank whose `ThreadComm` is dropped (its
/// thread returned or panicked) makes the others' pending and later collectives fail at once with
/// [`DistError::PeerGone`] naming it; a collective that waits longer than the timeout fails with
/// [`DistError::Timeout`] naming the ranks that had not arrived. Either failure breaks the group:
/// every later collective on every rank returns an error.
pub struct ThreadComm {
    rank: usize,
    group: Arc<Group>,
    seq: u64,
}

struct Group {
    world: usize,
    timeout: Option<Duration>,
    state: Mutex<State>,
    cv: Condvar,
}

struct State {
    arrived: usize,
    slots: Vec<Option<Contribution>>,
    results: Vec<Option<Arc<Vec<Contribution>>>>,
    gone: Vec<bool>,
    broken: Option<Failure>,
}

struct Contribution {
    op: &'static str,
    seq: u64,
    /// The layout every rank must agree on.
    sig: String,
    /// A size that may differ between ranks (all_gather's leading size).
    rows: usize,
    data: Vec<Payload>,
}

enum Payload {
    Host(HostVec),
    Wide(Wide),
}

#[derive(Clone)]
enum Failure {
    Timeout {
        op: &'static str,
        seq: u64,
        rank: usize,
        timeout_s: f64,
        missing: Vec<usize>,
    },
    Gone {
        op: &'static str,
        seq: u64,
        rank: usize,
    },
}

impl Failure {
    fn error(&self) -> DistError {
        match self.clone() {
            Failure::Timeout {
                op,
                seq,
                rank,
                timeout_s,
                missing,
            } => DistError::Timeout {
                op,
                seq,
                rank,
                timeout_s,
                missing,
            },
            Failure::Gone { op, seq, rank } => DistError::PeerGone { op, seq, rank },
        }
    }
}

impl ThreadComm {
    /// The `world` ranks of a new group, rank r at index r, with the default timeout
    /// ([`DEFAULT_TIMEOUT`]). Move each to its own thread.
    ///
    /// # Panics
    /// `world == 0`.
    pub fn group(world: usize) -> Vec<ThreadComm> {
        Self::group_with_timeout(world, Some(DEFAULT_TIMEOUT))
    }

    /// [`ThreadComm::group`] with a collective timeout (`None`: wait forever).
    ///
    /// # Panics
    /// `world == 0`.
    pub fn group_with_timeout(world: usize, timeout: Option<Duration>) -> Vec<ThreadComm> {
        assert!(world > 0, "a group has at least one rank");
        let group = Arc::new(Group {
            world,
            timeout,
            state: Mutex::new(State {
                arrived: 0,
                slots: (0..world).map(|_| None).collect(),
                results: vec![None; world],
                gone: vec![false; world],
                broken: None,
            }),
            cv: Condvar::new(),
        });
        (0..world)
            .map(|rank| ThreadComm {
                rank,
                group: group.clone(),
                seq: 0,
            })
            .collect()
    }

    /// Runs `f` on `world` scoped threads, one per rank, and returns their results in rank
    /// order.
    ///
    /// # Panics
    /// Re-raises the first panic of a rank's thread (after all threads ended).
    pub fn run<T: Send>(world: usize, f: impl Fn(ThreadComm) -> T + Sync) -> Vec<T> {
        Self::run_with_timeout(world, Some(DEFAULT_TIMEOUT), f)
    }

    /// [`ThreadComm::run`] with a collective timeout.
    ///
    /// # Panics
    /// As [`ThreadComm::run`].
    pub fn run_with_timeout<T: Send>(
        world: usize,
        timeout: Option<Duration>,
        f: impl Fn(ThreadComm) -> T + Sync,
    ) -> Vec<T> {
        let f = &f;
        std::thread::scope(|s| {
            let handles: Vec<_> = Self::group_with_timeout(world, timeout)
                .into_iter()
                .map(|c| s.spawn(move || f(c)))
                .collect();
            let joined: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
            joined
                .into_iter()
                .map(|r| r.unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock except on a bug; the state stays consistent.
        self.group.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Deposits this rank's contribution and returns every rank's, in rank order, after checking
    /// that they agree on the collective and its layout.
    fn exchange(
        &mut self,
        op: &'static str,
        sig: String,
        data: Vec<Payload>,
    ) -> Result<Arc<Vec<Contribution>>> {
        self.exchange_rows(op, sig, 0, data)
    }

    fn exchange_rows(
        &mut self,
        op: &'static str,
        sig: String,
        rows: usize,
        data: Vec<Payload>,
    ) -> Result<Arc<Vec<Contribution>>> {
        let seq = self.seq;
        self.seq += 1;
        let world = self.group.world;
        let mut st = self.lock();
        if let Some(f) = &st.broken {
            return Err(DistError::Broken(f.error().to_string()));
        }
        st.slots[self.rank] = Some(Contribution {
            op,
            seq,
            sig,
            rows,
            data,
        });
        st.arrived += 1;
        if st.arrived == world {
            let all: Vec<Contribution> = st
                .slots
                .iter_mut()
                .map(|s| s.take().expect("every rank arrived"))
                .collect();
            let all = Arc::new(all);
            for r in st.results.iter_mut() {
                *r = Some(all.clone());
            }
            st.arrived = 0;
            self.group.cv.notify_all();
        }
        let deadline = self.group.timeout.map(|t| Instant::now() + t);
        let all = loop {
            if let Some(all) = st.results[self.rank].take() {
                break all;
            }
            if let Some(f) = &st.broken {
                return Err(f.error());
            }
            if let Some(j) = (0..world).find(|&j| st.slots[j].is_none() && st.gone[j]) {
                let f = Failure::Gone { op, seq, rank: j };
                st.broken = Some(f.clone());
                self.group.cv.notify_all();
                return Err(f.error());
            }
            st = match deadline {
                None => self.group.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        let f = Failure::Timeout {
                            op,
                            seq,
                            rank: self.rank,
                            timeout_s: self.group.timeout.unwrap_or_default().as_secs_f64(),
                            missing: (0..world).filter(|&j| st.slots[j].is_none()).collect(),
                        };
                        st.broken = Some(f.clone());
                        self.group.cv.notify_all();
                        return Err(f.error());
                    }
                    self.group
                        .cv
                        .wait_timeout(st, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        };
        drop(st);
        let first = &all[0];
        if all
            .iter()
            .any(|c| c.op != first.op || c.sig != first.sig || c.seq != first.seq)
        {
            let detail = all
                .iter()
                .enumerate()
                .map(|(r, c)| format!("rank {r}: {} #{} {}", c.op, c.seq, c.sig))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(DistError::Mismatch { op, detail });
        }
        Ok(all)
    }
}

impl Drop for ThreadComm {
    fn drop(&mut self) {
        let mut st = self.lock();
        st.gone[self.rank] = true;
        self.group.cv.notify_all();
    }
}

fn layout(t: &Tensor) -> String {
    format!("{:?}{:?}", t.dtype(), t.dims())
}

fn host(p: &Payload) -> &HostVec {
    match p {
        Payload::Host(h) => h,
        Payload::Wide(_) => unreachable!("a host payload"),
    }
}

fn wide(p: &Payload) -> &Wide {
    match p {
        Payload::Wide(w) => w,
        Payload::Host(_) => unreachable!("a wide payload"),
    }
}

/// The reduction over all ranks of contribution `i`, in rank order.
fn reduce_all(all: &[Contribution], i: usize, op: Op) -> Wide {
    let mut acc = wide(&all[0].data[i]).clone();
    for c in &all[1..] {
        acc.fold(wide(&c.data[i]), op);
    }
    acc
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.group.world
    }

    fn all_reduce(&mut self, bufs: &[Tensor], op: Op) -> Result<()> {
        let mut data = Vec::with_capacity(bufs.len());
        for b in bufs {
            check_reducible("all_reduce", b.dtype())?;
            data.push(Payload::Wide(with_slice(b, "all_reduce", |s| {
                Ok(s.widen())
            })?));
        }
        let sig = format!(
            "{op:?} {}",
            bufs.iter().map(layout).collect::<Vec<_>>().join(",")
        );
        let all = self.exchange("all_reduce", sig, data)?;
        for (i, b) in bufs.iter().enumerate() {
            let acc = reduce_all(&all, i, op);
            with_slice(b, "all_reduce", |mut s| {
                s.narrow_from(&acc);
                Ok(())
            })?;
        }
        Ok(())
    }

    fn broadcast(&mut self, bufs: &[Tensor], root: usize) -> Result<()> {
        check_root("broadcast", root, self.group.world)?;
        let mut data = Vec::new();
        for b in bufs {
            check_copyable("broadcast", b.dtype())?;
            if self.rank == root {
                data.push(Payload::Host(with_slice(b, "broadcast", |s| {
                    Ok(s.to_vec())
                })?));
            }
        }
        let sig = format!(
            "root {root} {}",
            bufs.iter().map(layout).collect::<Vec<_>>().join(",")
        );
        let all = self.exchange("broadcast", sig, data)?;
        if self.rank != root {
            for (b, p) in bufs.iter().zip(&all[root].data) {
                with_slice(b, "broadcast", |mut s| {
                    s.copy_from(host(p));
                    Ok(())
                })?;
            }
        }
        Ok(())
    }

    fn all_gather(&mut self, shard: &Tensor) -> Result<Tensor> {
        check_gather_shape(shard)?;
        check_copyable("all_gather", shard.dtype())?;
        let mine = with_slice(shard, "all_gather", |s| Ok(s.to_vec()))?;
        let rest = &shard.dims()[1..];
        let sig = format!("{:?}[_, {rest:?}]", shard.dtype());
        let all = self.exchange_rows(
            "all_gather",
            sig,
            shard.dims()[0],
            vec![Payload::Host(mine)],
        )?;
        let total: usize = all.iter().map(|c| host(&c.data[0]).len()).sum();
        let mut out = HostVec::with_capacity(shard.dtype(), total);
        for c in all.iter() {
            let h = host(&c.data[0]);
            out.extend_from(h, 0..h.len());
        }
        let mut dims = vec![all.iter().map(|c| c.rows).sum()];
        dims.extend_from_slice(rest);
        out.into_tensor(dims, shard.device())
    }

    fn reduce_scatter(&mut self, flat: &Tensor, op: Op) -> Result<Tensor> {
        let world = self.group.world;
        let n = check_scatter_shape(flat, world)?;
        check_reducible("reduce_scatter", flat.dtype())?;
        let mine = with_slice(flat, "reduce_scatter", |s| Ok(s.widen()))?;
        let sig = format!("{op:?} {}", layout(flat));
        let all = self.exchange("reduce_scatter", sig, vec![Payload::Wide(mine)])?;
        let acc = reduce_all(&all, 0, op);
        let inner: usize = flat.dims()[1..].iter().product();
        let block = n * inner;
        let mut dims = flat.dims().to_vec();
        dims[0] = n;
        acc.narrow_to(flat.dtype(), self.rank * block..(self.rank + 1) * block)
            .into_tensor(dims, flat.device())
    }

    fn all_reduce_f64(&mut self, xs: &mut [f64], op: Op) -> Result<()> {
        let sig = format!("{op:?} f64[{}]", xs.len());
        let all = self.exchange(
            "all_reduce_f64",
            sig,
            vec![Payload::Wide(Wide::F64(xs.to_vec()))],
        )?;
        match reduce_all(&all, 0, op) {
            Wide::F64(v) => xs.copy_from_slice(&v),
            Wide::F32(_) => unreachable!("f64 in, f64 out"),
        }
        Ok(())
    }

    fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let all = self.exchange(
            "all_gather_bytes",
            String::new(),
            vec![Payload::Host(HostVec::U8(mine.to_vec()))],
        )?;
        Ok(all
            .iter()
            .map(|c| match host(&c.data[0]) {
                HostVec::U8(v) => v.clone(),
                _ => unreachable!("bytes"),
            })
            .collect())
    }

    fn broadcast_bytes(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        check_root("broadcast_bytes", root, self.group.world)?;
        let data = if self.rank == root {
            vec![Payload::Host(HostVec::U8(buf.clone()))]
        } else {
            Vec::new()
        };
        let all = self.exchange("broadcast_bytes", format!("root {root}"), data)?;
        if let HostVec::U8(v) = host(&all[root].data[0]) {
            buf.clone_from(v);
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.exchange("barrier", String::new(), Vec::new())?;
        Ok(())
    }
}
