//! The decode-step matmul kernels equal candle's matmul: the skinny kernel for a few rows, the
//! packed lm_head (AVX-512) for row counts around its 4-row block and partial panels.

use candle_core::{Device, Tensor};

/// Largest |a − b| over all elements (f32 tensors of one shape).
fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn skinny_matmul_equals_candle_matmul() {
    let d = Device::Cpu;
    for (m, k, n) in [(1, 8, 3), (8, 256, 1100), (3, 37, 513), (16, 64, 2000)] {
        let x = Tensor::randn(0f32, 1., (m, k), &d).unwrap();
        let w = Tensor::randn(0f32, 1., (n, k), &d).unwrap();
        let want = x.matmul(&w.t().unwrap()).unwrap();
        let got = rlvr_kernels::skinny_matmul(&x, &w).unwrap().unwrap();
        let diff = max_abs_diff(&want, &got);
        assert!(diff < 1e-4, "{m}x{k}x{n}: {diff}");
    }
}

/// The packed head equals candle's matmul for row counts around the 4-row block, widths that
/// are not a multiple of 16 and vocabularies with a partial last panel. Without AVX-512 it
/// declines (None), and the decode step keeps candle's matmul.
#[test]
fn packed_head_equals_candle_matmul() {
    let d = Device::Cpu;
    for (m, k, n) in [
        (1, 8, 3),
        (4, 64, 1000),
        (7, 37, 129),
        (33, 256, 2048),
        (64, 96, 65),
    ] {
        let x = Tensor::randn(0f32, 1., (m, k), &d).unwrap();
        let w = Tensor::randn(0f32, 1., (n, k), &d).unwrap();
        let Some(p) = rlvr_kernels::PackedHead::new(&w).unwrap() else {
            assert!(!rlvr_kernels::cpu::has_avx512());
            return;
        };
        let want = x.matmul(&w.t().unwrap()).unwrap();
        let got = p.matmul(&x).unwrap();
        assert_eq!(got.dims(), &[m, n]);
        let diff = max_abs_diff(&want, &got);
        assert!(diff < 1e-4, "{m}x{k}x{n}: {diff}");
    }
}
