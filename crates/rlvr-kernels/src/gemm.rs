//! A bounds-checked, single-threaded f32 GEMM over slices (the `gemm` crate's kernel), for the
//! fused lm_head's blocks. The only `unsafe` call into `gemm` is here.

/// A read-only matrix view: element (i, j) is `data[i · rs + j · cs]`.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

/// Whether a `rows × cols` matrix with strides (rs, cs) lies inside `len` elements.
fn fits(rows: usize, cols: usize, rs: usize, cs: usize, len: usize) -> bool {
    rows == 0 || cols == 0 || (rows - 1) * rs + (cols - 1) * cs < len
}

/// `dst[m, n] (+)= beta · lhs[m, k] · rhs[k, n]`, single-threaded; `dst` has row stride `dst_rs`
/// and column stride 1; with `accumulate` the product is added to `dst`, else it replaces it.
///
/// Panics when a matrix does not fit its slice or `dst`'s rows overlap (`dst_rs < n`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    accumulate: bool,
    lhs: MatRef<'_>,
    rhs: MatRef<'_>,
    beta: f32,
) {
    assert!(m == 0 || n == 0 || dst_rs >= n, "sgemm: dst rows overlap");
    assert!(fits(m, n, dst_rs, 1, dst.len()), "sgemm: dst out of bounds");
    assert!(
        fits(m, k, lhs.rs, lhs.cs, lhs.data.len()),
        "sgemm: lhs out of bounds"
    );
    assert!(
        fits(k, n, rhs.rs, rhs.cs, rhs.data.len()),
        "sgemm: rhs out of bounds"
    );
    // SAFETY: every element the shapes and strides address lies inside its slice (asserted
    // above); `dst` is borrowed mutably, so it overlaps neither input, and its rows are disjoint
    // (dst_rs ≥ n with column stride 1); `Parallelism::None` runs on this thread only.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            1.0,
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}
