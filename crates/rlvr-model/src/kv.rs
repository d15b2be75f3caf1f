//! Key/value stores for incremental decoding: the [`KvStore`] interface the decoder's attention
//! writes through, and [`KvCache`], a store that grows by concatenation (the reference; the
//! sampler's preallocated in-place cache is another implementation, in `rlvr-rollout`).

use candle_core::Tensor;

use crate::error::Result;

/// Where the attention of a cached forward keeps the keys and values of earlier positions.
///
/// One forward over T new positions calls [`KvStore::len`] once, then [`KvStore::append`] once
/// per layer in order, then [`KvStore::commit`] with T. Keys are stored after the rotary
/// embedding. Shapes: `[B, n_kv_heads, positions, head_dim]`.
pub trait KvStore {
    /// Number of positions already stored (committed).
    fn len(&self) -> usize;

    /// Whether nothing is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stores layer `layer`'s keys and values of the T new positions (`[B, n_kv, T, hd]`) after
    /// the [`KvStore::len`] stored ones and returns that layer's keys and values of all
    /// `len + T` positions (views are fine).
    ///
    /// Errors: the store is full, or a shape disagrees with what it holds.
    fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)>;

    /// Called once after every layer appended: `new` more positions are now stored.
    ///
    /// Errors: implementation-defined (e.g. a capacity exceeded).
    fn commit(&mut self, new: usize) -> Result<()>;
}

/// Per-layer key/value cache that grows by concatenation: `[B, n_kv_heads, S, head_dim]` per
/// layer. Simple and allocation-heavy; the reference for [`crate::Model::forward_cached`].
#[derive(Clone, Default)]
pub struct KvCache {
    /// Per layer, the stored `(keys, values)`; `None` before the first forward.
    pub layers: Vec<Option<(Tensor, Tensor)>>,
}

impl KvCache {
    /// An empty cache for `n_layers` layers.
    pub fn new(n_layers: usize) -> Self {
        Self {
            layers: vec![None; n_layers],
        }
    }

    /// Number of cached positions (0 when empty).
    pub fn len(&self) -> usize {
        self.layers
            .first()
            .and_then(|l| l.as_ref())
            .map(|(k, _)| k.dim(2).unwrap_or(0))
            .unwrap_or(0)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps only the batch rows `rows` (e.g. to drop finished sequences or to copy one prompt's
    /// cache to the K rows of its group).
    pub fn select_rows(&self, rows: &Tensor) -> Result<Self> {
        let layers = self
            .layers
            .iter()
            .map(|l| match l {
                None => Ok(None),
                Some((k, v)) => Ok(Some((k.index_select(rows, 0)?, v.index_select(rows, 0)?))),
            })
            .collect::<Result<_>>()?;
        Ok(Self { layers })
    }
}

impl KvStore for KvCache {
    fn len(&self) -> usize {
        KvCache::len(self)
    }

    fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let slot = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| crate::ModelError::Invalid(format!("KV cache has no layer {layer}")))?;
        let (k, v) = match slot.take() {
            None => (k.clone(), v.clone()),
            Some((pk, pv)) => (Tensor::cat(&[&pk, k], 2)?, Tensor::cat(&[&pv, v], 2)?),
        };
        *slot = Some((k.clone(), v.clone()));
        Ok((k, v))
    }

    fn commit(&mut self, _new: usize) -> Result<()> {
        Ok(())
    }
}
