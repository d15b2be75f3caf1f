//! Views of candle CPU storage as plain slices (shared by the ops of this crate).

use candle_core::{CpuStorage, Layout};

/// The contiguous f32 elements of a 2-D tensor, with its (rows, columns).
///
/// Errors: another dtype or a strided layout (`op` and `what` name the op and the input).
pub(crate) fn contiguous_f32_2d<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    op: &str,
    what: &str,
) -> candle_core::Result<(&'a [f32], usize, usize)> {
    let (r, c) = layout.shape().dims2()?;
    Ok((contiguous_f32(storage, layout, op, what)?, r, c))
}

/// The contiguous f32 elements of a tensor.
///
/// Errors: another dtype or a strided layout (`op` and `what` name the op and the input).
pub(crate) fn contiguous_f32<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    op: &str,
    what: &str,
) -> candle_core::Result<&'a [f32]> {
    let data = match storage {
        CpuStorage::F32(d) => d,
        _ => candle_core::bail!("{op} needs f32 {what}"),
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{op} needs contiguous {what}");
    };
    Ok(&data[start..end])
}

/// The contiguous f32 elements of a tensor, writable (in-place ops).
pub(crate) fn contiguous_f32_mut<'a>(
    storage: &'a mut CpuStorage,
    layout: &Layout,
    op: &str,
    what: &str,
) -> candle_core::Result<&'a mut [f32]> {
    let data = match storage {
        CpuStorage::F32(d) => d,
        _ => candle_core::bail!("{op} needs f32 {what}"),
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{op} needs contiguous {what}");
    };
    Ok(&mut data[start..end])
}
