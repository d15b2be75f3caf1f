//! Helpers shared by the algorithm tests.

use rlvr_algo::{Algorithm, AlgorithmConfig};

/// The resolved algorithm of preset `none` with the knobs `f` sets.
pub fn alg(f: impl FnOnce(&mut AlgorithmConfig)) -> Algorithm {
    let mut c = AlgorithmConfig::empty("none");
    f(&mut c);
    c.resolve().unwrap()
}
