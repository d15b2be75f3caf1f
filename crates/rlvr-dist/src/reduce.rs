//! [`DistReduce`]: the data-parallel gradient reduction of one optimizer update.

use std::ops::Range;

use candle_core::{DType, Device, Shape, Tensor};

use crate::{Communicator, DistError, Op, Result};

/// Sums every parameter's gradient over all ranks, and ORs the non-finite flag, in one
/// all-reduce per bucket.
///
/// Built once from the model's parameters (`Model::named_vars` order); then
/// [`DistReduce::reduce`] is called once per optimizer update, by every rank, with that rank's
/// gradient sums. The steps:
///
/// 1. every `None` (no micro-batch on this rank reached the parameter) becomes zeros of the
///    parameter's shape, since every rank must send the same layout;
/// 2. the gradients, in f32, are packed in parameter order into buckets of at most `bucket_mb`
///    MiB (a parameter larger than that gets a bucket of its own). The boundaries are a function
///    of the parameter shapes only, never of the data, so the reduction order is the same at
///    every update;
/// 3. the last bucket carries one extra element, 1 when this rank's update is non-finite and 0
///    otherwise;
/// 4. every bucket is all-reduced with [`Op::Sum`] (the loss weights are already global, so no
///    averaging);
/// 5. each entry becomes `Some` view of its bucket, f32, of the parameter's shape; the flag's
///    sum is the number of ranks that were non-finite, and any of them clears `finite` on every
///    rank.
///
/// With a world of 1 it does nothing: gradients and flag are left as they are.
pub struct DistReduce {
    comm: Box<dyn Communicator>,
    shapes: Vec<Shape>,
    device: Device,
    buckets: Vec<Range<usize>>,
    non_finite_ranks: usize,
}

/// The bucket size when none is given: 256 MiB of f32.
pub const DEFAULT_BUCKET_MB: usize = 256;

impl DistReduce {
    /// A reducer over `params` (the model's parameters in `named_vars` order; only their shapes
    /// and device are read) with [`DEFAULT_BUCKET_MB`].
    ///
    /// # Errors
    /// As [`DistReduce::with_bucket_mb`].
    pub fn new(comm: Box<dyn Communicator>, params: &[Tensor]) -> Result<Self> {
        Self::with_bucket_mb(comm, params, DEFAULT_BUCKET_MB)
    }

    /// A reducer whose buckets hold at most `bucket_mb` MiB of f32 each.
    ///
    /// # Errors
    /// `bucket_mb == 0`; parameters on different devices.
    pub fn with_bucket_mb(
        comm: Box<dyn Communicator>,
        params: &[Tensor],
        bucket_mb: usize,
    ) -> Result<Self> {
        let cap = bucket_mb.saturating_mul(1 << 20) / 4;
        Self::with_bucket_elems(comm, params, cap)
    }

    /// A reducer whose buckets hold at most `cap` f32 elements (tests use small ones).
    ///
    /// # Errors
    /// `cap == 0`; parameters on different devices.
    pub fn with_bucket_elems(
        comm: Box<dyn Communicator>,
        params: &[Tensor],
        cap: usize,
    ) -> Result<Self> {
        if cap == 0 {
            return Err(DistError::Invalid {
                op: "DistReduce",
                detail: "the bucket size must be positive".into(),
            });
        }
        let device = params.first().map_or(Device::Cpu, |p| p.device().clone());
        if let Some((i, p)) = params
            .iter()
            .enumerate()
            .find(|(_, p)| !p.device().same_device(&device))
        {
            return Err(DistError::Invalid {
                op: "DistReduce",
                detail: format!(
                    "parameter {i} is on {:?}, parameter 0 on {:?}: one device per rank",
                    p.device().location(),
                    device.location()
                ),
            });
        }
        let mut buckets = Vec::new();
        let (mut start, mut filled) = (0, 0usize);
        for (i, p) in params.iter().enumerate() {
            let n = p.elem_count();
            if i > start && filled + n > cap {
                buckets.push(start..i);
                (start, filled) = (i, 0);
            }
            filled += n;
        }
        // The last bucket (possibly empty of parameters) carries the flag.
        buckets.push(start..params.len());
        Ok(DistReduce {
            comm,
            shapes: params.iter().map(|p| p.shape().clone()).collect(),
            device,
            buckets,
            non_finite_ranks: 0,
        })
    }

    /// The parameter index ranges of the buckets, in order.
    pub fn buckets(&self) -> &[Range<usize>] {
        &self.buckets
    }

    /// The communicator (for the trainer's other collectives when it owns no other handle; see
    /// also [`crate::SharedComm`]).
    pub fn comm(&mut self) -> &mut dyn Communicator {
        &mut *self.comm
    }

    /// How many ranks reported a non-finite update at the last [`DistReduce::reduce`] (0 with a
    /// world of 1).
    pub fn non_finite_ranks(&self) -> usize {
        self.non_finite_ranks
    }

    /// Reduces `grads` (one entry per parameter, in the constructor's order) and `finite` over
    /// all ranks, in place (type docs).
    ///
    /// # Errors
    /// A wrong number of entries or a gradient of the wrong shape ([`DistError::Invalid`]);
    /// tensor errors while packing; the communicator's errors (a peer gone, a timeout).
    pub fn reduce(&mut self, grads: &mut [Option<Tensor>], finite: &mut bool) -> Result<()> {
        self.non_finite_ranks = 0;
        if grads.len() != self.shapes.len() {
            return Err(DistError::Invalid {
                op: "DistReduce",
                detail: format!(
                    "{} gradients for {} parameters",
                    grads.len(),
                    self.shapes.len()
                ),
            });
        }
        for (i, g) in grads.iter().enumerate() {
            if let Some(g) = g {
                if g.shape() != &self.shapes[i] {
                    return Err(DistError::Invalid {
                        op: "DistReduce",
                        detail: format!(
                            "gradient {i} has shape {:?}, its parameter {:?}",
                            g.dims(),
                            self.shapes[i].dims()
                        ),
                    });
                }
            }
        }
        if self.comm.world_size() == 1 {
            return Ok(());
        }
        let last = self.buckets.len() - 1;
        let mut packed = Vec::with_capacity(self.buckets.len());
        for (b, range) in self.buckets.iter().enumerate() {
            let mut parts = Vec::with_capacity(range.len() + 1);
            for i in range.clone() {
                parts.push(match &grads[i] {
                    Some(g) => g
                        .to_device(&self.device)?
                        .to_dtype(DType::F32)?
                        .flatten_all()?,
                    None => Tensor::zeros(self.shapes[i].elem_count(), DType::F32, &self.device)?,
                });
            }
            if b == last {
                let flag = if *finite { 0f32 } else { 1f32 };
                parts.push(Tensor::new(&[flag], &self.device)?);
            }
            // A fresh contiguous buffer (cat copies, even of one part).
            packed.push(Tensor::cat(&parts, 0)?.copy()?);
        }
        self.comm.all_reduce(&packed, Op::Sum)?;
        for (range, buf) in self.buckets.iter().zip(&packed) {
            let mut off = 0;
            for i in range.clone() {
                let n = self.shapes[i].elem_count();
                grads[i] = Some(buf.narrow(0, off, n)?.reshape(self.shapes[i].clone())?);
                off += n;
            }
        }
        let flags = &packed[last];
        let count = flags.narrow(0, flags.dim(0)? - 1, 1)?.to_vec1::<f32>()?[0];
        self.non_finite_ranks = count.round() as usize;
        if self.non_finite_ranks > 0 {
            *finite = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LocalComm, ThreadComm};

    fn params() -> Vec<Tensor> {
        [vec![3usize, 2], vec![5], vec![1], vec![4, 1]]
            .into_iter()
            .map(|s| Tensor::zeros(s, DType::F32, &Device::Cpu).unwrap())
            .collect()
    }

    #[test]
    fn buckets_depend_on_shapes_only() {
        let r = DistReduce::with_bucket_elems(Box::new(LocalComm), &params(), 6).unwrap();
        // 6 | 5 1 | 4 (+ flag)
        assert_eq!(r.buckets(), [0..1, 1..3, 3..4]);
        let r = DistReduce::with_bucket_elems(Box::new(LocalComm), &params(), 4).unwrap();
        assert_eq!(r.buckets(), [0..1, 1..2, 2..3, 3..4]);
        let r = DistReduce::new(Box::new(LocalComm), &params()).unwrap();
        assert_eq!((r.buckets().len(), r.buckets()[0].clone()), (1, 0..4));
        let r = DistReduce::new(Box::new(LocalComm), &[]).unwrap();
        assert_eq!((r.buckets().len(), r.buckets()[0].clone()), (1, 0..0));
        assert!(DistReduce::with_bucket_elems(Box::new(LocalComm), &params(), 0).is_err());
    }

    #[test]
    fn one_rank_leaves_everything_alone() {
        let mut r = DistReduce::new(Box::new(LocalComm), &params()).unwrap();
        let mut g = vec![
            None,
            Some(Tensor::ones(5, DType::F32, &Device::Cpu).unwrap()),
            None,
            None,
        ];
        let mut finite = false;
        r.reduce(&mut g, &mut finite).unwrap();
        assert!(g[0].is_none() && !finite);
        let mut short = vec![None];
        assert!(r
            .reduce(&mut short, &mut finite)
            .unwrap_err()
            .to_string()
            .contains("1 gradients for 4"));
        let mut wrong = vec![
            None,
            Some(Tensor::ones(4, DType::F32, &Device::Cpu).unwrap()),
            None,
            None,
        ];
        assert!(r
            .reduce(&mut wrong, &mut finite)
            .unwrap_err()
            .to_string()
            .contains("gradient 1 has shape [4]"));
    }

    /// Rank r's gradient of parameter i, or None for a parameter this rank's rows missed.
    fn grad(rank: usize, i: usize, shape: &Shape) -> Option<Tensor> {
        if (rank + i) % 3 == 2 {
            return None;
        }
        let n = shape.elem_count();
        let v: Vec<f32> = (0..n)
            .map(|k| ((rank * 31 + i * 7 + k) as f32 * 0.37).sin() / (1.0 + k as f32))
            .collect();
        Some(Tensor::from_vec(v, shape.clone(), &Device::Cpu).unwrap())
    }

    #[test]
    fn sums_gradients_and_ors_the_flag_on_every_rank() {
        for world in [2usize, 3] {
            for cap in [1usize, 6, 1000] {
                let ps = params();
                let out = ThreadComm::run(world, |c| {
                    let rank = c.rank();
                    let mut r = DistReduce::with_bucket_elems(Box::new(c), &ps, cap).unwrap();
                    let mut g: Vec<_> = ps
                        .iter()
                        .enumerate()
                        .map(|(i, p)| grad(rank, i, p.shape()))
                        .collect();
                    // Only the last rank saw a NaN loss.
                    let mut finite = rank != world - 1;
                    r.reduce(&mut g, &mut finite).unwrap();
                    assert_eq!(r.non_finite_ranks(), 1);
                    let flat: Vec<Vec<f32>> = g
                        .iter()
                        .map(|t| {
                            t.as_ref()
                                .unwrap()
                                .flatten_all()
                                .unwrap()
                                .to_vec1()
                                .unwrap()
                        })
                        .collect();
                    (finite, flat, g[0].as_ref().unwrap().dims().to_vec())
                });
                for (finite, flat, dims0) in &out {
                    assert!(!finite);
                    assert_eq!(dims0, &[3, 2]);
                    for (i, p) in ps.iter().enumerate() {
                        // The sum in rank order, each rank's None a zero.
                        let mut want: Option<Vec<f32>> = None;
                        for rank in 0..world {
                            let v: Vec<f32> = match grad(rank, i, p.shape()) {
                                Some(t) => t.flatten_all().unwrap().to_vec1().unwrap(),
                                None => vec![0.0; p.elem_count()],
                            };
                            match &mut want {
                                None => want = Some(v),
                                Some(w) => w.iter_mut().zip(v).for_each(|(a, b)| *a += b),
                            }
                        }
                        let want = want.unwrap();
                        assert_eq!(
                            flat[i].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            "world {world} cap {cap} param {i}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn all_finite_stays_finite() {
        let ps = params();
        let out = ThreadComm::run(2, |c| {
            let mut r = DistReduce::new(Box::new(c), &ps).unwrap();
            let mut g: Vec<Option<Tensor>> = vec![None; ps.len()];
            let mut finite = true;
            r.reduce(&mut g, &mut finite).unwrap();
            (finite, r.non_finite_ranks(), g.iter().all(|t| t.is_some()))
        });
        assert_eq!(out, [(true, 0, true), (true, 0, true)]);
    }
}
