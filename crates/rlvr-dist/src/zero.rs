//! ZeRO stage 1 (Rajbhandari et al., arXiv 1910.02054, "P_os"): the optimizer state (AdamW's
//! moments and the f32 masters of 16-bit weights) sharded across ranks by whole parameters.
//!
//! Per optimizer update, with [`ZeroReduce`]:
//!
//! 1. **Reduce to the owner**: rank r's region is the parameters it owns, flattened in parameter
//!    order; reduce-scatters ([`Op::Sum`]) over buckets of every rank's region (at most
//!    [`DEFAULT_BUCKET_MB`] MiB of f32 each) leave each rank the sums of its own parameters only,
//!    so no rank holds the whole reduced gradient; the non-finite flags are summed alongside.
//! 2. **The exact global norm**: each rank's sum of squares of its own reduced gradients, summed
//!    over the ranks ([`ZeroReduce::norm_sq`]), is the one-process ‖g‖² (up to the order of the
//!    f64 additions); clipping uses it on every rank alike.
//! 3. **Each owner updates its parameters** (the optimizer skips the others: it keeps no state for
//!    them);
//! 4. **The new weights reach every rank**: each owner broadcasts its parameters in place, one
//!    collective per owner and dtype ([`ZeroReduce::share_weights`]).
//!
//! **Stage 2** ([`ZeroReduce::with_sharded_gradients`], ZeRO's "P_os+g"): the gradients are
//! sharded too. Step 1 runs per micro-batch instead of per update: after each micro-batch's
//! backward every rank calls [`ZeroReduce::reduce_micro_batch`], which leaves it the sums over the
//! ranks of that micro-batch's gradients of its own parameters; it adds them to its f32
//! accumulation and drops the rest, so no rank holds the whole gradient sum across
//! micro-batches (the whole gradient of one micro-batch stays transient: the backward gives it
//! whole). Ranks with fewer micro-batches take part in the others' with no gradients: the count
//! is agreed per update ([`ZeroReduce::agree_micro_batches`], the largest). At the update,
//! [`ZeroReduce::reduce`] combines the non-finite flags only; steps 2 to 4 are stage 1's. The
//! sum's order changes: Σ over micro-batches of Σ over ranks, where stage 0 and 1 take
//! Σ over ranks of each rank's Σ over micro-batches (equal in exact arithmetic; bit-equal when
//! every rank has at most one micro-batch; fixed for a fixed world size and micro-batching).
//!
//! Owners ([`assign_owners`]) are a function of the parameter sizes and the world size only.
//! Checkpoints are gathered on save ([`ZeroReduce::gather_to_root`]: each owner broadcasts one
//! parameter's state at a time, rank 0 keeps it), so they hold what one process would write and
//! load at any world size, re-sharded by the new owners.

use candle_core::{DType, Device, Tensor, Var};

use crate::{Communicator, DistError, Op, Result};

/// The owner of each parameter: greedy longest-processing-time over the ranks (parameters by
/// size, largest first, ties by index; each to the rank holding the fewest elements so far, ties
/// to the lowest rank). Deterministic, and within the largest parameter of a perfect balance.
///
/// # Panics
/// `world == 0`.
pub fn assign_owners(sizes: &[usize], world: usize) -> Vec<usize> {
    assert!(world > 0, "a world of 0 ranks");
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
    let mut load = vec![0usize; world];
    let mut owner = vec![0usize; sizes.len()];
    for i in order {
        let r = (0..world).min_by_key(|&r| (load[r], r)).unwrap_or(0);
        owner[i] = r;
        load[r] += sizes[i];
    }
    owner
}

/// Elements each rank owns under `owner` ([`assign_owners`]).
pub fn owned_elements(sizes: &[usize], owner: &[usize], world: usize) -> Vec<usize> {
    let mut load = vec![0usize; world];
    for (s, &r) in sizes.iter().zip(owner) {
        load[r] += s;
    }
    load
}

/// The reduce-scatter bucket when none is given: 64 MiB of f32 over all ranks together.
pub const DEFAULT_BUCKET_MB: usize = 64;

/// The ZeRO-1 side of one rank (module docs).
pub struct ZeroReduce {
    comm: Box<dyn Communicator>,
    shapes: Vec<candle_core::Shape>,
    owner: Vec<usize>,
    owned: Vec<bool>,
    /// The largest region (owned elements of one rank) + 1.
    chunk: usize,
    /// Elements per rank per reduce-scatter bucket.
    bucket: usize,
    device: Device,
    non_finite_ranks: usize,
    /// ZeRO-2: gradients reduced per micro-batch ([`ZeroReduce::with_sharded_gradients`]).
    shard_gradients: bool,
}

impl ZeroReduce {
    /// The ZeRO-1 reduction over `params` (the model's parameters in `named_vars` order; their
    /// shapes and device are read).
    ///
    /// # Errors
    /// Parameters on different devices.
    pub fn new(comm: Box<dyn Communicator>, params: &[Tensor]) -> Result<Self> {
        let device = params.first().map_or(Device::Cpu, |p| p.device().clone());
        if params.iter().any(|p| !p.device().same_device(&device)) {
            return Err(DistError::Invalid {
                op: "ZeroReduce",
                detail: "the parameters are on different devices".into(),
            });
        }
        let sizes: Vec<usize> = params.iter().map(Tensor::elem_count).collect();
        let world = comm.world_size();
        let owner = assign_owners(&sizes, world);
        let chunk = owned_elements(&sizes, &owner, world)
            .into_iter()
            .max()
            .unwrap_or(0)
            + 1;
        let rank = comm.rank();
        Ok(ZeroReduce {
            owned: owner.iter().map(|&r| r == rank).collect(),
            shapes: params.iter().map(|p| p.shape().clone()).collect(),
            owner,
            chunk,
            bucket: (DEFAULT_BUCKET_MB << 20) / 4 / world.max(1),
            device,
            comm,
            non_finite_ranks: 0,
            shard_gradients: false,
        })
    }

    /// Buckets of at most `elems` f32 per rank (tests use small ones; at least 1).
    pub fn with_bucket_elems(mut self, elems: usize) -> Self {
        self.bucket = elems.max(1);
        self
    }

    /// ZeRO stage 2: the gradients sharded too. Each micro-batch's gradients go to their owners
    /// at once ([`ZeroReduce::reduce_micro_batch`]), so a rank accumulates only its own share;
    /// [`ZeroReduce::reduce`] then combines the non-finite flags only.
    pub fn with_sharded_gradients(mut self) -> Self {
        self.shard_gradients = true;
        self
    }

    /// Whether the gradients are sharded (ZeRO-2) as well as the optimizer state.
    pub fn shards_gradients(&self) -> bool {
        self.shard_gradients
    }

    /// Which parameters this rank owns (updates and keeps optimizer state for).
    pub fn owned(&self) -> &[bool] {
        &self.owned
    }

    /// The owner of each parameter.
    pub fn owners(&self) -> &[usize] {
        &self.owner
    }

    /// Ranks whose part of the last update was non-finite.
    pub fn non_finite_ranks(&self) -> usize {
        self.non_finite_ranks
    }

    /// Step 1 of the module docs: leaves in `grads` the sums over all ranks of this rank's own
    /// parameters (`Some`, f32) and `None` for the others; clears `finite` on every rank when any
    /// rank's part was non-finite.
    ///
    /// Each rank's owned parameters, flattened in parameter order, form its region; the regions
    /// are reduce-scattered in buckets of at most `bucket` elements per rank (bucket k: every
    /// rank's elements [k·s, (k+1)·s) of each region, zero-padded), so the transient memory is
    /// one bucket of W·s f32 plus this rank's reduced region, never the whole gradient twice.
    ///
    /// # Errors
    /// A failed collective; a count of gradients differing from the parameters'.
    pub fn reduce(&mut self, grads: &mut [Option<Tensor>], finite: &mut bool) -> Result<()> {
        self.check_len("ZeroReduce::reduce", grads.len())?;
        let mut flag = [if *finite { 0.0 } else { 1.0 }];
        self.comm.all_reduce_f64(&mut flag, Op::Sum)?;
        self.non_finite_ranks = flag[0].round() as usize;
        if self.non_finite_ranks > 0 {
            *finite = false;
        }
        if self.shard_gradients {
            // ZeRO-2: every micro-batch was reduced to its owners already
            // ([`ZeroReduce::reduce_micro_batch`]); what this rank accumulated is its share.
            for (g, &mine) in grads.iter_mut().zip(&self.owned) {
                if !mine {
                    *g = None;
                }
            }
            return Ok(());
        }
        self.scatter(grads)
    }

    /// ZeRO-2, after each micro-batch's backward on every rank together: leaves in `grads` the
    /// sums over the ranks of this micro-batch's gradients of this rank's own parameters (`Some`,
    /// f32; zeros where no rank's micro-batch reached one) and `None` for the others, whose
    /// gradients are dropped as soon as their last bucket is sent. The caller adds the owned sums
    /// to its accumulation; `None` entries (a rank with fewer micro-batches, a non-finite loss)
    /// take part as zeros. Every rank must call it the same number of times per update
    /// ([`ZeroReduce::agree_micro_batches`]).
    ///
    /// # Errors
    /// A failed collective; a count of gradients differing from the parameters'.
    pub fn reduce_micro_batch(&mut self, grads: &mut [Option<Tensor>]) -> Result<()> {
        self.check_len("ZeroReduce::reduce_micro_batch", grads.len())?;
        self.scatter(grads)
    }

    /// ZeRO-2: the number of micro-batches every rank runs in this update, the largest of the
    /// ranks' `local` counts (one `all_reduce_f64` with [`Op::Max`]); a rank with fewer takes part
    /// in the rest with no gradients. Counts are exact in f64 (below 2⁵³).
    ///
    /// # Errors
    /// A failed collective.
    pub fn agree_micro_batches(&mut self, local: usize) -> Result<usize> {
        let mut x = [local as f64];
        self.comm.all_reduce_f64(&mut x, Op::Max)?;
        Ok(x[0] as usize)
    }

    fn check_len(&self, op: &'static str, n: usize) -> Result<()> {
        if n != self.shapes.len() {
            return Err(DistError::Invalid {
                op,
                detail: format!("{n} gradients for {} parameters", self.shapes.len()),
            });
        }
        Ok(())
    }

    /// The reduction to the owners (steps 1 of the module docs without the flag): `grads` in,
    /// this rank's owned sums out (`Some`, f32), `None` elsewhere. A gradient is dropped once
    /// its last element has gone into a bucket.
    fn scatter(&mut self, grads: &mut [Option<Tensor>]) -> Result<()> {
        let world = self.comm.world_size();
        // Each rank's region: (parameter, elements) in order.
        let regions: Vec<Vec<usize>> = (0..world)
            .map(|r| (0..grads.len()).filter(|&i| self.owner[i] == r).collect())
            .collect();
        let region_len = self.chunk - 1;
        let s = self.bucket.max(1).min(region_len.max(1));
        let rank = self.comm.rank();
        // This rank's reduced parameters, filled bucket by bucket (each bucket's output dropped
        // once copied in).
        let mut out: Vec<Option<Tensor>> = (0..grads.len())
            .map(|i| {
                (self.owner[i] == rank)
                    .then(|| Tensor::zeros(self.shapes[i].elem_count(), DType::F32, &self.device))
                    .transpose()
            })
            .collect::<candle_core::Result<_>>()?;
        let mut k0 = 0;
        while k0 < region_len {
            let k1 = (k0 + s).min(region_len);
            let mut parts: Vec<Tensor> = Vec::new();
            for region in &regions {
                // Elements [k0, k1) of this region, from the parameters they fall in.
                let mut at = 0;
                let mut filled = 0;
                for &i in region {
                    let n = self.shapes[i].elem_count();
                    let (lo, hi) = (k0.max(at), k1.min(at + n));
                    if lo < hi {
                        // Narrowed before the conversion: one bucket's part is converted, not
                        // the whole parameter once per bucket it spans.
                        let g = match &grads[i] {
                            Some(g) => g
                                .flatten_all()?
                                .narrow(0, lo - at, hi - lo)?
                                .to_dtype(DType::F32)?,
                            None => Tensor::zeros(hi - lo, DType::F32, &self.device)?,
                        };
                        parts.push(g);
                        filled += hi - lo;
                        if hi == at + n {
                            // Its last elements are in this bucket: the caller's gradient is no
                            // longer needed (its output, if owned here, is `out`).
                            grads[i] = None;
                        }
                    }
                    at += n;
                    if at >= k1 {
                        break;
                    }
                }
                if filled < k1 - k0 {
                    parts.push(Tensor::zeros(k1 - k0 - filled, DType::F32, &self.device)?);
                }
            }
            let flat = Tensor::cat(&parts, 0)?;
            drop(parts);
            let mine = self.comm.reduce_scatter(&flat, Op::Sum)?;
            drop(flat);
            // Copy elements [k0, k1) of this rank's region into its parameters.
            let mut at = 0;
            for &i in &regions[rank] {
                let n = self.shapes[i].elem_count();
                let (lo, hi) = (k0.max(at), k1.min(at + n));
                if lo < hi {
                    if let Some(t) = &out[i] {
                        t.slice_set(&mine.narrow(0, lo - k0, hi - lo)?, 0, lo - at)?;
                    }
                }
                at += n;
            }
            k0 = k1;
        }
        for (i, g) in grads.iter_mut().enumerate() {
            *g = match out[i].take() {
                Some(t) => Some(t.reshape(self.shapes[i].clone())?),
                None => None,
            };
        }
        Ok(())
    }

    /// Step 2: the sum over the ranks of each rank's sum of squares of its own reduced gradients.
    ///
    /// # Errors
    /// A failed collective.
    pub fn norm_sq(&mut self, local: f64) -> Result<f64> {
        let mut x = [local];
        self.comm.all_reduce_f64(&mut x, Op::Sum)?;
        Ok(x[0])
    }

    /// Step 4: every owner broadcasts its (just updated) parameters, in place in every rank's
    /// parameter storage, one collective per owner and dtype.
    ///
    /// # Errors
    /// A failed collective; `params` not matching the parameters it was built from.
    pub fn share_weights(&mut self, params: &[Var]) -> Result<()> {
        if params.len() != self.shapes.len() {
            return Err(DistError::Invalid {
                op: "ZeroReduce::share_weights",
                detail: format!(
                    "{} parameters, built for {}",
                    params.len(),
                    self.shapes.len()
                ),
            });
        }
        let world = self.comm.world_size();
        let mut dtypes: Vec<DType> = params.iter().map(|p| p.dtype()).collect();
        dtypes.sort_by_key(|d| d.as_str());
        dtypes.dedup();
        for r in 0..world {
            for &dt in &dtypes {
                let idx: Vec<usize> = (0..params.len())
                    .filter(|&i| self.owner[i] == r && params[i].dtype() == dt)
                    .collect();
                if idx.is_empty() {
                    continue;
                }
                // In place: the owner's parameters are read, every other rank's are written (no
                // packed copy).
                let bufs: Vec<Tensor> = idx
                    .iter()
                    .map(|&i| params[i].as_tensor().flatten_all())
                    .collect::<candle_core::Result<_>>()?;
                self.comm.broadcast(&bufs, r)?;
            }
        }
        Ok(())
    }

    /// For a checkpoint: parameter `i`'s optimizer state tensors `state` (its moments, its
    /// master), held by its owner, broadcast from there one tensor at a time; returns them on
    /// rank 0 (`None` elsewhere, where each is dropped at once, so no rank but 0 ever holds more
    /// than one parameter's state it does not own). Every rank calls it for every parameter in
    /// order, with the same `shapes` (the state tensors' shapes, f32).
    ///
    /// # Errors
    /// A failed collective; a wrong number of tensors on the owner.
    pub fn gather_to_root(
        &mut self,
        i: usize,
        state: Option<&[Tensor]>,
        count: usize,
    ) -> Result<Option<Vec<Tensor>>> {
        let owner = self.owner[i];
        let rank = self.comm.rank();
        let mut out = Vec::with_capacity(count);
        for k in 0..count {
            let t = if rank == owner {
                let s = state.ok_or_else(|| DistError::Invalid {
                    op: "ZeroReduce::gather_to_root",
                    detail: format!("rank {rank} owns parameter {i} but passed no state"),
                })?;
                s.get(k)
                    .ok_or_else(|| DistError::Invalid {
                        op: "ZeroReduce::gather_to_root",
                        detail: format!("parameter {i}: {} state tensors, {count} wanted", s.len()),
                    })?
                    .to_dtype(DType::F32)?
                    .contiguous()?
                    .copy()?
            } else {
                Tensor::zeros(self.shapes[i].clone(), DType::F32, &self.device)?
            };
            self.comm.broadcast(std::slice::from_ref(&t), owner)?;
            if rank == 0 {
                out.push(t);
            }
        }
        Ok((rank == 0).then_some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ThreadComm;

    #[test]
    fn owners_are_balanced_deterministic_and_cover_every_parameter() {
        // Largest first: 100 → r0; 60 → r1; 50 → r1 (60 < 100); 40 → r0 (100 < 110); 10 → r1.
        let sizes = [40, 100, 50, 60, 10];
        let o = assign_owners(&sizes, 2);
        assert_eq!(o, vec![0, 0, 1, 1, 1]);
        assert_eq!(owned_elements(&sizes, &o, 2), vec![140, 120]);
        assert_eq!(assign_owners(&sizes, 1), vec![0; 5]);
        // More ranks than parameters: some own none.
        assert_eq!(
            owned_elements(&[5, 5], &assign_owners(&[5, 5], 3), 3),
            vec![5, 5, 0]
        );
        // Within the largest parameter of a perfect split.
        let sizes: Vec<usize> = (0..50).map(|i| (i * 7919) % 1000 + 1).collect();
        for w in 1..6 {
            let load = owned_elements(&sizes, &assign_owners(&sizes, w), w);
            let (hi, lo) = (load.iter().max().unwrap(), load.iter().min().unwrap());
            assert!(hi - lo <= 1000, "w {w}: {load:?}");
        }
    }

    /// Two and three ranks: each owner ends with the sum over the ranks of its parameters'
    /// gradients (equal to an in-process sum), the others with `None`; the squared norms sum to
    /// the whole gradient's; a NaN on one rank clears `finite` everywhere; shared weights arrive.
    #[test]
    fn reduce_to_owner_norm_and_shared_weights() {
        let shapes: Vec<Vec<usize>> = vec![vec![3, 2], vec![5], vec![2, 2], vec![7]];
        for world in [2usize, 3] {
            let grad = |rank: usize, i: usize| -> Tensor {
                let n: usize = shapes[i].iter().product();
                let v: Vec<f32> = (0..n)
                    .map(|k| ((rank * 31 + i * 7 + k) as f32 * 0.37).sin())
                    .collect();
                Tensor::from_vec(v, shapes[i].clone(), &Device::Cpu).unwrap()
            };
            let out = ThreadComm::run(world, |c| {
                let rank = c.rank();
                let params: Vec<Tensor> = shapes
                    .iter()
                    .map(|s| Tensor::zeros(s.clone(), DType::F32, &Device::Cpu).unwrap())
                    .collect();
                // Buckets of 4 elements per rank: regions span several buckets and parameters.
                let mut z = ZeroReduce::new(Box::new(c), &params)
                    .unwrap()
                    .with_bucket_elems(4);
                // Parameter 1 reached by no micro-batch on rank 0.
                let mut g: Vec<Option<Tensor>> = (0..shapes.len())
                    .map(|i| (rank != 0 || i != 1).then(|| grad(rank, i)))
                    .collect();
                let mut finite = true;
                z.reduce(&mut g, &mut finite).unwrap();
                let local: f64 = g
                    .iter()
                    .flatten()
                    .map(|t| {
                        t.sqr()
                            .unwrap()
                            .sum_all()
                            .unwrap()
                            .to_scalar::<f32>()
                            .unwrap() as f64
                    })
                    .sum();
                let total = z.norm_sq(local).unwrap();
                // NaN on the last rank.
                let mut g2: Vec<Option<Tensor>> =
                    (0..shapes.len()).map(|i| Some(grad(rank, i))).collect();
                let mut f2 = rank + 1 != world;
                z.reduce(&mut g2, &mut f2).unwrap();
                // Each owner sets its parameters to (rank + 1); everyone must see the owner's value.
                let vars: Vec<Var> = params
                    .iter()
                    .map(|p| Var::from_tensor(p).unwrap())
                    .collect();
                for (i, v) in vars.iter().enumerate() {
                    if z.owned()[i] {
                        v.set(&(v.as_tensor().ones_like().unwrap() * (rank + 1) as f64).unwrap())
                            .unwrap();
                    }
                }
                z.share_weights(&vars).unwrap();
                let seen: Vec<f32> = vars
                    .iter()
                    .map(|v| {
                        v.as_tensor()
                            .flatten_all()
                            .unwrap()
                            .get(0)
                            .unwrap()
                            .to_scalar::<f32>()
                            .unwrap()
                    })
                    .collect();
                let mine: Vec<(usize, Vec<f32>)> = g
                    .into_iter()
                    .enumerate()
                    .filter_map(|(i, t)| {
                        t.map(|t| (i, t.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
                    })
                    .collect();
                (z.owners().to_vec(), mine, total, f2, seen)
            });
            let owners = out[0].0.clone();
            let mut whole = 0f64;
            for i in 0..shapes.len() {
                let mut sum = grad(0, i).zeros_like().unwrap();
                for r in 0..world {
                    if r != 0 || i != 1 {
                        sum = (sum + grad(r, i)).unwrap();
                    }
                }
                whole += sum
                    .sqr()
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap() as f64;
                let want = sum.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                let (_, got) = out[owners[i]].1.iter().find(|(j, _)| *j == i).unwrap();
                for (a, b) in got.iter().zip(&want) {
                    assert!(
                        (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                        "param {i}: {a} vs {b}"
                    );
                }
                for (r, o) in out.iter().enumerate() {
                    assert_eq!(o.1.iter().any(|(j, _)| *j == i), r == owners[i]);
                    assert_eq!(o.4[i], (owners[i] + 1) as f32, "rank {r} sees param {i}");
                }
            }
            for o in &out {
                assert!((o.2 - whole).abs() <= 1e-9 * whole, "{} vs {whole}", o.2);
                assert!(
                    !o.3,
                    "the NaN of the last rank must clear finite everywhere"
                );
            }
        }
    }

    /// ZeRO-2 on two and three ranks with different numbers of micro-batches (rank r has r + 1,
    /// the last rank none at three ranks): the count agreed is the largest; each owner's
    /// accumulated share is the whole sum over ranks and micro-batches (to f32 rounding: the
    /// order differs from stage 1's, which is also checked), the non-owners hold nothing, and a
    /// rerun is bit-identical. With one micro-batch a rank, stage 2 equals stage 1 bit for bit.
    #[test]
    fn stage_2_accumulates_each_owners_share_of_every_micro_batch() {
        let shapes: Vec<Vec<usize>> = vec![vec![3, 2], vec![5], vec![2, 2], vec![7], vec![1]];
        let grad = |rank: usize, m: usize, i: usize| -> Tensor {
            let n: usize = shapes[i].iter().product();
            let v: Vec<f32> = (0..n)
                .map(|k| ((rank * 31 + m * 17 + i * 7 + k) as f32 * 0.37).sin() * 1e3)
                .collect();
            Tensor::from_vec(v, shapes[i].clone(), &Device::Cpu).unwrap()
        };
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // Per rank: (owned, stage-1 sums, stage-2 sums, agreed count) for micro-batch counts `mbs`.
        type Out = (
            Vec<bool>,
            Vec<Option<Vec<f32>>>,
            Vec<Option<Vec<f32>>>,
            usize,
        );
        let run = |world: usize, mbs: &(dyn Fn(usize) -> usize + Sync)| -> Vec<Out> {
            ThreadComm::run(world, |c| {
                let rank = c.rank();
                let params: Vec<Tensor> = shapes
                    .iter()
                    .map(|s| Tensor::zeros(s.clone(), DType::F32, &Device::Cpu).unwrap())
                    .collect();
                let comm = crate::SharedComm::new(Box::new(c));
                let mut one = ZeroReduce::new(Box::new(comm.clone()), &params)
                    .unwrap()
                    .with_bucket_elems(4);
                let mut two = ZeroReduce::new(Box::new(comm), &params)
                    .unwrap()
                    .with_bucket_elems(4)
                    .with_sharded_gradients();
                assert!(two.shards_gradients() && !one.shards_gradients());
                // Stage 1: this rank's sum over its micro-batches, then one reduction.
                let mine = mbs(rank);
                let mut g1: Vec<Option<Tensor>> = (0..shapes.len())
                    .map(|i| {
                        (0..mine)
                            .map(|m| grad(rank, m, i))
                            .reduce(|a, b| (a + b).unwrap())
                    })
                    .collect();
                let mut finite = true;
                one.reduce(&mut g1, &mut finite).unwrap();
                // Stage 2: every micro-batch reduced, the share accumulated (in order).
                let rounds = two.agree_micro_batches(mine).unwrap();
                let mut acc: Vec<Option<Tensor>> = vec![None; shapes.len()];
                for m in 0..rounds {
                    let mut g: Vec<Option<Tensor>> = (0..shapes.len())
                        .map(|i| (m < mine).then(|| grad(rank, m, i)))
                        .collect();
                    two.reduce_micro_batch(&mut g).unwrap();
                    for (i, x) in g.into_iter().enumerate() {
                        assert_eq!(x.is_some(), two.owned()[i], "rank {rank} param {i}");
                        if let Some(x) = x {
                            acc[i] = Some(match acc[i].take() {
                                None => x,
                                Some(a) => (a + x).unwrap(),
                            });
                        }
                    }
                }
                let mut finite2 = true;
                two.reduce(&mut acc, &mut finite2).unwrap();
                assert!(finite && finite2);
                (
                    two.owned().to_vec(),
                    g1.iter().map(|t| t.as_ref().map(flat)).collect(),
                    acc.iter().map(|t| t.as_ref().map(flat)).collect(),
                    rounds,
                )
            })
        };
        for world in [2usize, 3] {
            let counts = move |r: usize| if r == 2 { 0 } else { r + 1 };
            let out = run(world, &counts);
            assert_eq!(run(world, &counts), out, "a rerun differs");
            for (r, (owned, s1, s2, rounds)) in out.iter().enumerate() {
                assert_eq!(*rounds, world.min(2), "rank {r}: the agreed count");
                for i in 0..shapes.len() {
                    assert_eq!(s2[i].is_some(), owned[i], "rank {r} param {i}");
                    let (Some(a), Some(b)) = (&s1[i], &s2[i]) else {
                        continue;
                    };
                    // The exact sum in f64, for the tolerance.
                    let n = a.len();
                    let mut want = vec![0f64; n];
                    for q in 0..world {
                        for m in 0..counts(q) {
                            for (w, x) in want.iter_mut().zip(flat(&grad(q, m, i))) {
                                *w += f64::from(x);
                            }
                        }
                    }
                    for k in 0..n {
                        for got in [a[k], b[k]] {
                            let err = (f64::from(got) - want[k]).abs();
                            assert!(err <= 1e-6 * 4e3, "param {i}[{k}]: {got} vs {}", want[k]);
                        }
                    }
                }
            }
            // The order differs: somewhere the two stages' sums differ in their last bits.
            assert!(
                out.iter().any(|(_, s1, s2, _)| s1 != s2),
                "{world} ranks: expected some rounding difference between the orders"
            );
            // One micro-batch a rank (none on the last at three ranks): bit for bit stage 1's.
            let single = move |r: usize| usize::from(r < 2);
            for (_, s1, s2, _) in run(world, &single) {
                assert_eq!(s1, s2, "{world} ranks, one micro-batch a rank");
            }
        }
    }

    #[test]
    fn gather_to_root_brings_each_owners_state_to_rank_0() {
        let out = ThreadComm::run(3, |c| {
            let rank = c.rank();
            let params: Vec<Tensor> = [4usize, 9, 2]
                .iter()
                .map(|&n| Tensor::zeros(n, DType::F32, &Device::Cpu).unwrap())
                .collect();
            let mut z = ZeroReduce::new(Box::new(c), &params).unwrap();
            let mut got = Vec::new();
            for (i, p) in params.iter().enumerate() {
                let state = z.owned()[i].then(|| {
                    vec![
                        (p.ones_like().unwrap() * (10 * i + 1) as f64).unwrap(),
                        (p.ones_like().unwrap() * (10 * i + 2) as f64).unwrap(),
                    ]
                });
                got.push(z.gather_to_root(i, state.as_deref(), 2).unwrap());
            }
            (rank, got)
        });
        for (rank, got) in out {
            for (i, g) in got.into_iter().enumerate() {
                if rank != 0 {
                    assert!(g.is_none());
                    continue;
                }
                let g = g.unwrap();
                assert_eq!(g[0].to_vec1::<f32>().unwrap()[0], (10 * i + 1) as f32);
                assert_eq!(g[1].to_vec1::<f32>().unwrap()[0], (10 * i + 2) as f32);
            }
        }
    }
}
