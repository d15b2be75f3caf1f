//! CPU feature detection, done once per process: every kernel asks [`features`].

use std::sync::OnceLock;

/// The instruction-set extensions the kernels use, as detected on the running CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// AVX2 and FMA (the vectorised exp, softmax pieces and the skinny matmul).
    pub avx2_fma: bool,
    /// AVX-512F (the packed lm_head's microkernel).
    pub avx512f: bool,
}

/// The running CPU's [`Features`] (detected on the first call, then cached).
pub fn features() -> Features {
    static F: OnceLock<Features> = OnceLock::new();
    *F.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Features {
    Features {
        avx2_fma: std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"),
        avx512f: std::is_x86_feature_detected!("avx512f"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Features {
    Features {
        avx2_fma: false,
        avx512f: false,
    }
}

/// Whether the running CPU has AVX2 and FMA.
pub fn has_avx2() -> bool {
    features().avx2_fma
}

/// Whether the running CPU has AVX-512F.
pub fn has_avx512() -> bool {
    features().avx512f
}
