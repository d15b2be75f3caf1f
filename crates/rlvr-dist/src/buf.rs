//! Host access to a tensor's elements, in place, for the engines (crate-internal).
//!
//! A CPU tensor is reached through candle's [`InplaceOp1`]: the closure gets a `&mut` slice of
//! exactly the tensor's elements inside its storage, so a collective writes the result where the
//! tensor lives (no copy on CPU). A tensor on another device is staged: copied to the host, the
//! closure runs there, and the host copy is written back into the device tensor's own storage
//! (`slice_set`), so the caller's tensor is still updated in place.

use std::cell::RefCell;

use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Shape, Tensor};
use half::{bf16, f16};

use crate::{DistError, Op, Result};

/// A tensor's elements as a typed mutable slice.
pub(crate) enum Slice<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
    BF16(&'a mut [bf16]),
    F16(&'a mut [f16]),
    U8(&'a mut [u8]),
    U32(&'a mut [u32]),
    I64(&'a mut [i64]),
}

/// Owned elements of one dtype (a contribution or a result).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum HostVec {
    F32(Vec<f32>),
    F64(Vec<f64>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    U8(Vec<u8>),
    U32(Vec<u32>),
    I64(Vec<i64>),
}

/// The precision a reduction runs in: f32 for f32, bf16 and f16 (rounded back once at the end),
/// f64 for f64.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Wide {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// The dtypes reductions accept.
pub(crate) fn check_reducible(op: &'static str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 => Ok(()),
        other => Err(DistError::Invalid {
            op,
            detail: format!("supports f32, f64, bf16 and f16 tensors, got {other:?}"),
        }),
    }
}

/// The dtypes the copying collectives (broadcast, all-gather) accept.
pub(crate) fn check_copyable(op: &'static str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32
        | DType::F64
        | DType::BF16
        | DType::F16
        | DType::U8
        | DType::U32
        | DType::I64 => Ok(()),
        other => Err(DistError::Invalid {
            op,
            detail: format!("supports f32, f64, bf16, f16, u8, u32 and i64 tensors, got {other:?}"),
        }),
    }
}

/// Runs `f` on the elements of `t` in place (module docs). `t` must be contiguous (any start
/// offset); its elements are those of its layout, in row-major order.
pub(crate) fn with_slice<R>(
    t: &Tensor,
    op: &'static str,
    f: impl FnOnce(Slice<'_>) -> Result<R>,
) -> Result<R> {
    if !t.is_contiguous() {
        return Err(DistError::Invalid {
            op,
            detail: format!(
                "needs a contiguous tensor (shape {:?}, stride {:?}): call .contiguous() first",
                t.dims(),
                t.stride()
            ),
        });
    }
    check_copyable(op, t.dtype())?;
    if t.elem_count() == 0 {
        // candle refuses in-place ops on empty tensors (a zero stride); there is nothing to write.
        return f(match t.dtype() {
            DType::F32 => Slice::F32(&mut []),
            DType::F64 => Slice::F64(&mut []),
            DType::BF16 => Slice::BF16(&mut []),
            DType::F16 => Slice::F16(&mut []),
            DType::U8 => Slice::U8(&mut []),
            DType::U32 => Slice::U32(&mut []),
            DType::I64 => Slice::I64(&mut []),
            _ => unreachable!("checked by check_copyable"),
        });
    }
    if t.device().is_cpu() {
        let access = Access {
            f: RefCell::new(Some(f)),
            out: RefCell::new(None),
        };
        t.inplace_op1(&access)?;
        return access
            .out
            .into_inner()
            .expect("the in-place op ran its closure");
    }
    // Staged through the host: the same closure on a host copy, then written back in place.
    let host = t.to_device(&Device::Cpu)?;
    let out = with_slice(&host, op, f)?;
    let back = host.flatten_all()?.copy()?.to_device(t.device())?;
    t.flatten_all()?.slice_set(&back, 0, 0)?;
    Ok(out)
}

struct Access<F, R> {
    f: RefCell<Option<F>>,
    out: RefCell<Option<Result<R>>>,
}

impl<F: FnOnce(Slice<'_>) -> Result<R>, R> InplaceOp1 for Access<F, R> {
    fn name(&self) -> &'static str {
        "rlvr-dist-access"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("rlvr-dist: not contiguous".into()))?;
        let slice = match storage {
            CpuStorage::F32(v) => Slice::F32(&mut v[start..end]),
            CpuStorage::F64(v) => Slice::F64(&mut v[start..end]),
            CpuStorage::BF16(v) => Slice::BF16(&mut v[start..end]),
            CpuStorage::F16(v) => Slice::F16(&mut v[start..end]),
            CpuStorage::U8(v) => Slice::U8(&mut v[start..end]),
            CpuStorage::U32(v) => Slice::U32(&mut v[start..end]),
            CpuStorage::I64(v) => Slice::I64(&mut v[start..end]),
            // Refused earlier by check_copyable.
            _ => {
                return Err(candle_core::Error::Msg(
                    "rlvr-dist: unsupported dtype".into(),
                ))
            }
        };
        let f = self
            .f
            .borrow_mut()
            .take()
            .expect("the in-place op runs once");
        *self.out.borrow_mut() = Some(f(slice));
        Ok(())
    }
}

impl Slice<'_> {
    /// A copy of the elements.
    pub(crate) fn to_vec(&self) -> HostVec {
        match self {
            Slice::F32(v) => HostVec::F32(v.to_vec()),
            Slice::F64(v) => HostVec::F64(v.to_vec()),
            Slice::BF16(v) => HostVec::BF16(v.to_vec()),
            Slice::F16(v) => HostVec::F16(v.to_vec()),
            Slice::U8(v) => HostVec::U8(v.to_vec()),
            Slice::U32(v) => HostVec::U32(v.to_vec()),
            Slice::I64(v) => HostVec::I64(v.to_vec()),
        }
    }

    /// Overwrites the elements with `src` (same dtype and length, checked by the caller).
    pub(crate) fn copy_from(&mut self, src: &HostVec) {
        match (self, src) {
            (Slice::F32(d), HostVec::F32(s)) => d.copy_from_slice(s),
            (Slice::F64(d), HostVec::F64(s)) => d.copy_from_slice(s),
            (Slice::BF16(d), HostVec::BF16(s)) => d.copy_from_slice(s),
            (Slice::F16(d), HostVec::F16(s)) => d.copy_from_slice(s),
            (Slice::U8(d), HostVec::U8(s)) => d.copy_from_slice(s),
            (Slice::U32(d), HostVec::U32(s)) => d.copy_from_slice(s),
            (Slice::I64(d), HostVec::I64(s)) => d.copy_from_slice(s),
            _ => unreachable!("copy_from: dtypes checked by the caller"),
        }
    }

    /// The elements in the precision their reduction runs in (a copy).
    pub(crate) fn widen(&self) -> Wide {
        match self {
            Slice::F32(v) => Wide::F32(v.to_vec()),
            Slice::BF16(v) => Wide::F32(v.iter().map(|x| x.to_f32()).collect()),
            Slice::F16(v) => Wide::F32(v.iter().map(|x| x.to_f32()).collect()),
            Slice::F64(v) => Wide::F64(v.to_vec()),
            _ => unreachable!("widen: dtype checked by check_reducible"),
        }
    }

    /// Overwrites the elements with `w`, rounding to nearest-even for bf16 and f16.
    pub(crate) fn narrow_from(&mut self, w: &Wide) {
        match (self, w) {
            (Slice::F32(d), Wide::F32(s)) => d.copy_from_slice(s),
            (Slice::BF16(d), Wide::F32(s)) => d
                .iter_mut()
                .zip(s)
                .for_each(|(d, s)| *d = bf16::from_f32(*s)),
            (Slice::F16(d), Wide::F32(s)) => d
                .iter_mut()
                .zip(s)
                .for_each(|(d, s)| *d = f16::from_f32(*s)),
            (Slice::F64(d), Wide::F64(s)) => d.copy_from_slice(s),
            _ => unreachable!("narrow_from: dtypes checked by the caller"),
        }
    }
}

impl HostVec {
    pub(crate) fn len(&self) -> usize {
        match self {
            HostVec::F32(v) => v.len(),
            HostVec::F64(v) => v.len(),
            HostVec::BF16(v) => v.len(),
            HostVec::F16(v) => v.len(),
            HostVec::U8(v) => v.len(),
            HostVec::U32(v) => v.len(),
            HostVec::I64(v) => v.len(),
        }
    }

    /// An empty vector of `dtype` with room for `n` elements.
    pub(crate) fn with_capacity(dtype: DType, n: usize) -> HostVec {
        match dtype {
            DType::F32 => HostVec::F32(Vec::with_capacity(n)),
            DType::F64 => HostVec::F64(Vec::with_capacity(n)),
            DType::BF16 => HostVec::BF16(Vec::with_capacity(n)),
            DType::F16 => HostVec::F16(Vec::with_capacity(n)),
            DType::U8 => HostVec::U8(Vec::with_capacity(n)),
            DType::U32 => HostVec::U32(Vec::with_capacity(n)),
            DType::I64 => HostVec::I64(Vec::with_capacity(n)),
            other => unreachable!("with_capacity: {other:?} checked by check_copyable"),
        }
    }

    /// Appends `other[range]` (same dtype).
    pub(crate) fn extend_from(&mut self, other: &HostVec, range: std::ops::Range<usize>) {
        match (self, other) {
            (HostVec::F32(d), HostVec::F32(s)) => d.extend_from_slice(&s[range]),
            (HostVec::F64(d), HostVec::F64(s)) => d.extend_from_slice(&s[range]),
            (HostVec::BF16(d), HostVec::BF16(s)) => d.extend_from_slice(&s[range]),
            (HostVec::F16(d), HostVec::F16(s)) => d.extend_from_slice(&s[range]),
            (HostVec::U8(d), HostVec::U8(s)) => d.extend_from_slice(&s[range]),
            (HostVec::U32(d), HostVec::U32(s)) => d.extend_from_slice(&s[range]),
            (HostVec::I64(d), HostVec::I64(s)) => d.extend_from_slice(&s[range]),
            _ => unreachable!("extend_from: dtypes checked by the caller"),
        }
    }

    /// A tensor of `shape` on `device` holding these elements.
    pub(crate) fn into_tensor(self, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        let t = match self {
            HostVec::F32(v) => Tensor::from_vec(v, shape, &Device::Cpu)?,
            HostVec::F64(v) => Tensor::from_vec(v, shape, &Device::Cpu)?,
            HostVec::BF16(v) => Tensor::from_vec(v, shape, &Device::Cpu)?,
            HostVec::F16(v) => Tensor::from_vec(v, shape, &Device::Cpu)?,
            HostVec::U8(v) => Tensor::from_vec(v, shape, &Device::Cpu)?,
            HostVec::U32(v) => Tensor::from_vec(v, shape, &Device::Cpu)?,
            HostVec::I64(v) => Tensor::from_vec(v, shape, &Device::Cpu)?,
        };
        Ok(t.to_device(device)?)
    }
}

/// `acc ← acc ∘ x`, elementwise (`Max`/`Min` keep `acc` unless `x` compares strictly greater
/// or smaller, so NaN handling is that of the comparison and is not part of the contract).
pub(crate) fn fold<T: Copy + PartialOrd + std::ops::Add<Output = T>>(
    acc: &mut [T],
    x: &[T],
    op: Op,
) {
    match op {
        Op::Sum => acc.iter_mut().zip(x).for_each(|(a, b)| *a = *a + *b),
        Op::Max => acc.iter_mut().zip(x).for_each(|(a, b)| {
            if *b > *a {
                *a = *b
            }
        }),
        Op::Min => acc.iter_mut().zip(x).for_each(|(a, b)| {
            if *b < *a {
                *a = *b
            }
        }),
    }
}

impl Wide {
    /// Elements `range` in `dtype` (a reducible one), rounded to nearest-even for bf16 and f16.
    pub(crate) fn narrow_to(&self, dtype: DType, range: std::ops::Range<usize>) -> HostVec {
        match (self, dtype) {
            (Wide::F32(v), DType::F32) => HostVec::F32(v[range].to_vec()),
            (Wide::F32(v), DType::BF16) => {
                HostVec::BF16(v[range].iter().map(|x| bf16::from_f32(*x)).collect())
            }
            (Wide::F32(v), DType::F16) => {
                HostVec::F16(v[range].iter().map(|x| f16::from_f32(*x)).collect())
            }
            (Wide::F64(v), DType::F64) => HostVec::F64(v[range].to_vec()),
            (w, d) => unreachable!("narrow_to: {d:?} from {w:?} checked by the caller"),
        }
    }

    /// `self ← self ∘ other` (same variant and length, checked by the caller).
    pub(crate) fn fold(&mut self, other: &Wide, op: Op) {
        match (self, other) {
            (Wide::F32(a), Wide::F32(b)) => fold(a, b, op),
            (Wide::F64(a), Wide::F64(b)) => fold(a, b, op),
            _ => unreachable!("Wide::fold: dtypes checked by the caller"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_on_cpu_writes_the_tensor_and_its_view_only() {
        let base = Tensor::arange(0f32, 10.0, &Device::Cpu).unwrap();
        let view = base.narrow(0, 3, 4).unwrap();
        let n = with_slice(&view, "test", |s| {
            let Slice::F32(v) = s else { panic!() };
            assert_eq!(v, &[3.0, 4.0, 5.0, 6.0]);
            v.iter_mut().for_each(|x| *x = -*x);
            Ok(v.len())
        })
        .unwrap();
        assert_eq!(n, 4);
        assert_eq!(
            base.to_vec1::<f32>().unwrap(),
            [0.0, 1.0, 2.0, -3.0, -4.0, -5.0, -6.0, 7.0, 8.0, 9.0]
        );
    }

    #[test]
    fn non_contiguous_and_unsupported_tensors_are_refused() {
        let t = Tensor::zeros((2, 3), DType::F32, &Device::Cpu)
            .unwrap()
            .t()
            .unwrap();
        let e = with_slice(&t, "all_reduce", |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("all_reduce: needs a contiguous tensor"),
            "{e}"
        );
        let t = Tensor::zeros(3, DType::U32, &Device::Cpu).unwrap();
        assert!(check_reducible("all_reduce", t.dtype())
            .unwrap_err()
            .to_string()
            .contains("got U32"));
    }

    #[test]
    fn bf16_is_reduced_in_f32_and_rounded_once() {
        let a = [bf16::from_f32(1.0), bf16::from_f32(256.0)];
        let mut acc = Slice::BF16(&mut a.clone()).widen();
        // 1 + 2^-8 + 2^-8 is representable in f32; bf16 (8 bits) would lose each 2^-8 alone.
        let small = Slice::BF16(&mut [bf16::from_f32(1.0 / 256.0), bf16::from_f32(1.0)]).widen();
        acc.fold(&small, Op::Sum);
        acc.fold(&small, Op::Sum);
        let mut out = a;
        Slice::BF16(&mut out).narrow_from(&acc);
        assert_eq!(out[0], bf16::from_f32(1.0 + 2.0 / 256.0));
        assert_eq!(out[1], bf16::from_f32(258.0));
    }
}
