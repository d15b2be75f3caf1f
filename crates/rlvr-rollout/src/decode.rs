//! The sampler's side of the decoder: a preallocated KV cache written in place ([`KvBuffer`], a
//! [`KvStore`] of `rlvr_model`'s one forward) and the last-position logits of a forward.
//!
//! The layers themselves are `rlvr_model::Model::forward`'s (the training forward), so decode
//! logits equal `Model::forward_cached`'s up to the summation order of the decode fast paths
//! (tested in `parity_tests`). What this module adds is the bookkeeping:
//!
//! - the cache of each layer is one `[B, n_kv_heads, S_max, head_dim]` tensor allocated once per
//!   wave; new keys/values are written into columns with `slice_set` (no `Tensor::cat`), and the
//!   attention reads the first `len` columns as a strided view;
//! - the attention bias of a decode step is a view of one `[B, S_max]` f32 row per sequence
//!   (0 visible, −1e30 padding) built once per wave, not a host-built `[B, 1, T, S]` tensor;
//! - rows can be dropped ([`KvBuffer::keep_rows`]) when their completions finish;
//! - on the CPU in f32 with AVX-512, the decode steps' lm_head runs on a head packed once per
//!   `sample` call (`rlvr_kernels::PackedHead`).

use candle_core::{DType, Tensor};
use rlvr_kernels::PackedHead;
use rlvr_model::{FusedOp, KvStore, Model, ModelError};

use crate::error::Result;

/// Masked attention bias, the value `rlvr_model` uses: finite, so that a padding query row (which
/// sees no key) gives a uniform softmax instead of NaN.
pub(crate) const MASK_BIAS: f32 = rlvr_model::model::MASK_BIAS;

/// Preallocated per-layer key/value cache of B rows and `capacity` columns, plus the per-row
/// attention bias over columns.
pub struct KvBuffer {
    /// Per layer `(k, v)`, each `[B, n_kv_heads, capacity, head_dim]`, rotary already applied.
    layers: Vec<(Tensor, Tensor)>,
    /// `[B, capacity]` f32: 0 where the column holds a real token, −1e30 for padding.
    bias: Tensor,
    /// Columns written so far.
    len: usize,
    capacity: usize,
}

impl KvBuffer {
    /// A zeroed cache for `model` of `rows` × `capacity` columns whose bias rows are `bias`
    /// (`[rows][capacity]`, 0 or [`MASK_BIAS`]).
    ///
    /// Errors: `bias` is not `rows · capacity` long, out of device memory.
    pub(crate) fn new(model: &Model, bias: Vec<f32>, rows: usize, capacity: usize) -> Result<Self> {
        let c = model.config();
        let shape = (rows, c.num_key_value_heads, capacity, c.head_dim);
        let (dtype, dev) = (model.dtype(), model.device());
        let layers = (0..c.num_hidden_layers)
            .map(|_| {
                Ok((
                    Tensor::zeros(shape, dtype, dev)?,
                    Tensor::zeros(shape, dtype, dev)?,
                ))
            })
            .collect::<Result<_>>()?;
        let bias = Tensor::from_vec(bias, (rows, capacity), dev)?;
        Ok(Self {
            layers,
            bias,
            len: 0,
            capacity,
        })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.bias.dims()[0]
    }

    /// Columns written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no column was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Cache columns per row.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Layer `layer`'s key and value caches `[B, n_kv_heads, capacity, head_dim]` (the fused
    /// decode step writes and reads them in place).
    #[cfg(any(test, feature = "cuda"))]
    pub(crate) fn layer(&self, layer: usize) -> Option<&(Tensor, Tensor)> {
        self.layers.get(layer)
    }

    /// Tests: replaces layer `layer`'s key and value caches with `k` and `v` of the same shape
    /// (the host emulation of the fused step writes its own copies back).
    ///
    /// Errors: no such layer, a shape differs.
    #[cfg(test)]
    pub(crate) fn set_layer(&mut self, layer: usize, k: Tensor, v: Tensor) -> Result<()> {
        match self.layers.get_mut(layer) {
            Some((k0, v0)) if k0.dims() == k.dims() && v0.dims() == v.dims() => {
                (*k0, *v0) = (k, v);
                Ok(())
            }
            _ => Err(ModelError::Invalid(format!(
                "KV cache layer {layer}: no such layer or shape"
            ))
            .into()),
        }
    }

    /// LongRoPE's switch for row `row`, whose context and tokens `seq` (its new token last) just
    /// passed `original_max_position_embeddings`: runs `seq` alone through `model` (a prefill
    /// whose positions reach past the switch, so every key rotates with the long factors),
    /// writes its keys and values over the row's visible columns (its real tokens, in order,
    /// the new token's column included), and returns the logits `[1, V]` of its last position.
    /// This is what transformers' `Phi3ForCausalLM.prepare_inputs_for_generation` does when it
    /// drops its cache at the switch: the row's tokens from there on are those of full forwards.
    ///
    /// Errors: the row's visible columns are not `seq.len()` (a layout this does not know),
    /// tensor errors.
    pub(crate) fn recompute_row(
        &mut self,
        model: &Model,
        row: usize,
        seq: &[u32],
        head: Option<&PackedHead>,
    ) -> Result<Tensor> {
        let n = seq.len();
        let bias: Vec<f32> = (self.bias.narrow(0, row, 1)?.narrow(1, 0, self.len)?)
            .flatten_all()?
            .to_vec1()?;
        let cols: Vec<usize> = (0..self.len)
            .filter(|&j| bias[j] > MASK_BIAS * 0.5)
            .collect();
        if cols.len() != n {
            return Err(ModelError::Invalid(format!(
                "LongRoPE switch: row {row} holds {} tokens in the cache, its sequence {n}",
                cols.len()
            ))
            .into());
        }
        let dev = model.device();
        let mut one = KvBuffer::new(model, vec![0.0; n], 1, n)?;
        let ids = Tensor::from_slice(seq, (1, n), dev)?;
        let pos: Vec<u32> = (0..n as u32).collect();
        let causal: Vec<f32> = (0..n * n)
            .map(|x| if x % n <= x / n { 0.0 } else { MASK_BIAS })
            .collect();
        let causal = Tensor::from_vec(causal, (1, 1, n, n), dev)?;
        let logits = forward_last(model, &ids, &pos, Some(&causal), &mut one, head)?;
        // The visible columns as runs (start column, length, offset in `seq`).
        let mut runs: Vec<(usize, usize, usize)> = vec![];
        for (o, &c) in cols.iter().enumerate() {
            match runs.last_mut() {
                Some((c0, m, _)) if *c0 + *m == c => *m += 1,
                _ => runs.push((c, 1, o)),
            }
        }
        for ((k, v), (k1, v1)) in self.layers.iter_mut().zip(&one.layers) {
            let (nkv, hd) = (k.dim(1)?, k.dim(3)?);
            for &(c0, m, o) in &runs {
                let at = [row..row + 1, 0..nkv, c0..c0 + m, 0..hd];
                *k = k.slice_assign(&at, &k1.narrow(2, o, m)?)?;
                *v = v.slice_assign(&at, &v1.narrow(2, o, m)?)?;
            }
        }
        Ok(logits)
    }

    /// The per-row attention bias `[B, capacity]` f32.
    #[cfg(any(test, feature = "cuda"))]
    pub(crate) fn bias_rows(&self) -> &Tensor {
        &self.bias
    }

    /// The attention bias `[B, 1, 1, len + 1]` of a decode step (one new column per row).
    fn step_bias(&self) -> Result<Tensor> {
        let s = self.len + 1;
        if s > self.capacity {
            return Err(self.full(s));
        }
        Ok(self.bias.narrow(1, 0, s)?.reshape((self.rows(), 1, 1, s))?)
    }

    fn full(&self, s: usize) -> crate::RolloutError {
        ModelError::Invalid(format!(
            "KV cache full: {s} columns needed, capacity {}",
            self.capacity
        ))
        .into()
    }

    /// Keeps (and reorders, or repeats) the rows listed in `rows` (indices into the current
    /// rows): used to drop finished completions and to copy a prompt's prefill to its K rows.
    ///
    /// Errors: an index is out of range.
    pub fn keep_rows(&mut self, rows: &[u32]) -> Result<()> {
        let dev = self.bias.device().clone();
        let idx = Tensor::from_slice(rows, rows.len(), &dev)?;
        for (k, v) in self.layers.iter_mut() {
            *k = k.index_select(&idx, 0)?;
            *v = v.index_select(&idx, 0)?;
        }
        self.bias = self.bias.index_select(&idx, 0)?;
        Ok(())
    }
}

/// Kept turns (multi-turn episodes, `crate::engine::TurnCache`): loading earlier keys/values
/// into a fresh buffer and reading one row's columns back out.
impl KvBuffer {
    /// Writes `layers` (per layer `(k, v)`, each `[rows, n_kv_heads, cols, head_dim]`) into
    /// columns `0..cols` of an empty buffer and marks them written.
    ///
    /// Errors: the buffer is not empty, a shape disagrees, `cols` exceeds the capacity.
    pub(crate) fn preload(&mut self, layers: &[(Tensor, Tensor)], cols: usize) -> Result<()> {
        if self.len != 0 || layers.len() != self.layers.len() || cols > self.capacity {
            return Err(ModelError::Invalid(format!(
                "KV preload of {} layers × {cols} columns into a buffer of {} layers, {} of {} \
                 columns written",
                layers.len(),
                self.layers.len(),
                self.len,
                self.capacity
            ))
            .into());
        }
        for ((ck, cv), (k, v)) in self.layers.iter().zip(layers) {
            ck.slice_set(&k.contiguous()?, 2, 0)?;
            cv.slice_set(&v.contiguous()?, 2, 0)?;
        }
        self.len = cols;
        Ok(())
    }

    /// Row `row`'s keys and values at the column ranges `segments` (`(start, len)`, in order),
    /// concatenated: per layer `(k, v)`, each `[1, n_kv_heads, Σ len, head_dim]`, in storage of
    /// their own (the buffer can be dropped).
    ///
    /// Errors: a row or column out of range.
    pub(crate) fn row_columns(
        &self,
        row: usize,
        segments: &[(usize, usize)],
    ) -> Result<Vec<(Tensor, Tensor)>> {
        let take = |t: &Tensor| -> Result<Tensor> {
            let r = t.narrow(0, row, 1)?;
            let parts = segments
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|&(s, n)| r.narrow(2, s, n))
                .collect::<candle_core::Result<Vec<_>>>()?;
            Ok(match parts.len() {
                0 => r.narrow(2, 0, 0)?.force_contiguous()?,
                1 => parts[0].force_contiguous()?,
                _ => Tensor::cat(&parts, 2)?,
            })
        };
        self.layers
            .iter()
            .map(|(k, v)| Ok((take(k)?, take(v)?)))
            .collect()
    }
}

impl KvStore for KvBuffer {
    fn len(&self) -> usize {
        self.len
    }

    /// Writes the new columns in place (`slice_set`) and returns views of the first
    /// `len + T` columns.
    fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> rlvr_model::Result<(Tensor, Tensor)> {
        let s = self.len + k.dim(2)?;
        if s > self.capacity {
            return Err(ModelError::Invalid(format!(
                "KV cache full: {s} columns needed, capacity {}",
                self.capacity
            )));
        }
        let (ck, cv) = self
            .layers
            .get(layer)
            .ok_or_else(|| ModelError::Invalid(format!("KV cache has no layer {layer}")))?;
        ck.slice_set(k, 2, self.len)?;
        cv.slice_set(v, 2, self.len)?;
        Ok((ck.narrow(2, 0, s)?, cv.narrow(2, 0, s)?))
    }

    fn commit(&mut self, new: usize) -> rlvr_model::Result<()> {
        self.len += new;
        Ok(())
    }
}

/// How the sampler runs its decode steps for a model on its device: the switches
/// `kernels.decode` and `kernels.cuda_graphs` (rlvr-model's `KernelSwitches`, set from the
/// config's `[kernels]`) resolved against the model's device, dtype and shapes (issue 50).
///
/// `fused`: the decode step's fused kernels (`rlvr_kernels::triton::families::decode` with the
/// training kernels' RMSNorm-add and SwiGLU); `cuda_graphs`: the step replayed as a CUDA graph
/// per batch-size bucket (`rlvr_kernels::graph`), which needs `fused` (candle's eager step
/// allocates inside the step, which a graph cannot replay). Both are off on the CPU, and off by
/// default on CUDA until the GPU check has passed them (`GPU_VERIFIED`). On CUDA, `fused` runs
/// the step as [`crate::fused::StepProgram`] (the sampler's `fused_step`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct DecodePath {
    /// The fused decode kernels run the step.
    pub fused: bool,
    /// The step is replayed as a CUDA graph.
    pub cuda_graphs: bool,
}

impl DecodePath {
    /// The path `model` decodes on (the switches resolved; a shape, dtype or device the fused
    /// step does not cover, or graphs asked for without the fused step, is said once in the log).
    pub fn of(model: &Model) -> Self {
        let (k, cfg) = (model.kernels(), model.config());
        let (dtype, dev) = (model.dtype(), model.device());
        let fused = k.resolve(FusedOp::Decode, cfg, dtype, dev);
        let graphs = k.resolve(FusedOp::CudaGraphs, cfg, dtype, dev);
        if graphs && !fused {
            rlvr_model::kernels::log_once(
                "kernels.cuda_graphs = on: the graphs replay the fused decode step, and \
                 kernels.decode is not on; the decode steps run eagerly"
                    .to_string(),
            );
        }
        DecodePath {
            fused,
            cuda_graphs: graphs && fused,
        }
    }

    /// `candle`, `fused` or `fused+graphs` (for reports).
    pub fn name(&self) -> &'static str {
        match (self.fused, self.cuda_graphs) {
            (false, _) => "candle",
            (true, false) => "fused",
            (true, true) => "fused+graphs",
        }
    }
}

/// The lm_head of `model` packed for this call's decode steps; `None` where the CPU lacks
/// AVX-512, or off the CPU / f32. Pack again after the weights change.
///
/// Errors: out of memory.
pub(crate) fn packed_head(model: &Model) -> Result<Option<PackedHead>> {
    Ok(PackedHead::new(model.head_weight())?)
}

/// Runs `t` new positions of every row through `model` against `cache` (their keys/values go
/// into columns `cache.len()..cache.len() + t`) and returns the logits `[B, vocab]` (f32) of the
/// last new position.
///
/// - `ids`: `[B, t]` u32 token ids.
/// - `positions`: `B · t` rotary positions (row-major).
/// - `bias`: the attention bias `[B, 1, t, len + t]` when `t > 1` (prefill, causal + padding);
///   `None` for a decode step (`t = 1`), which uses the cache's bias rows.
/// - `head`: the packed lm_head, used for f32 on the CPU (then softcapped for Gemma 2, as
///   `Model::lm_head` is).
///
/// Errors: the cache is full, or a shape disagrees.
pub(crate) fn forward_last(
    model: &Model,
    ids: &Tensor,
    positions: &[u32],
    bias: Option<&Tensor>,
    cache: &mut KvBuffer,
    head: Option<&PackedHead>,
) -> Result<Tensor> {
    forward_last_masked(model, ids, positions, bias, None, cache, head)
}

/// [`forward_last`] with the key mask `[B][T]` a prefill's causal padding `bias` was built from,
/// so that the fused attention reads its layout from it (`Model::forward_masked`).
pub(crate) fn forward_last_masked(
    model: &Model,
    ids: &Tensor,
    positions: &[u32],
    bias: Option<&Tensor>,
    key_mask: Option<&[Vec<u32>]>,
    cache: &mut KvBuffer,
    head: Option<&PackedHead>,
) -> Result<Tensor> {
    let (b, t) = ids.dims2()?;
    let step_bias;
    let bias = match bias {
        Some(bias) => bias,
        None => {
            step_bias = cache.step_bias()?;
            &step_bias
        }
    };
    let x = model.forward_masked(ids, positions, bias, key_mask, Some(cache), false)?;
    let last = if t == 1 {
        x.reshape((b, model.config().hidden_size))?
    } else {
        x.narrow(1, t - 1, 1)?.squeeze(1)?
    };
    match head {
        // The packed product is the plain lm_head: Gemma 2's final softcapping after it.
        Some(p) if last.dtype() == DType::F32 && last.device().is_cpu() => {
            Ok(model.softcap_logits(p.matmul(&last)?)?)
        }
        _ => Ok(model.lm_head(&last, false)?.to_dtype(DType::F32)?),
    }
}

/// Tests: the forward launch record whose name starts with `prefix` in `dir` (its folder name
/// and its record.json), panicking with the names found when there is none.
#[cfg(test)]
pub(crate) fn forward_record(dir: &std::path::Path, prefix: &str) -> (String, serde_json::Value) {
    let recs: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let name = (recs.iter())
        .find(|n| n.starts_with(prefix) && n.contains("fwd"))
        .unwrap_or_else(|| panic!("no {prefix}*fwd* record among {recs:?}"))
        .clone();
    let text = std::fs::read_to_string(dir.join(&name).join("record.json")).unwrap();
    (name, serde_json::from_str(&text).unwrap())
}

/// Tests: copies record `name` of `dir` to `$RLVR_KERNEL_RECORD/<folder>/<name>` when that is
/// set (CI), where `scripts/ci_kernels.sh` replays it under Triton's interpreter (it finds
/// records at any depth).
#[cfg(test)]
pub(crate) fn keep_record_for_ci(dir: &std::path::Path, name: &str, folder: &str) {
    if let Some(d) = std::env::var_os(rlvr_kernels::triton::record::RECORD_ENV) {
        let to = std::path::PathBuf::from(d).join(folder).join(name);
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(dir.join(name)).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use rlvr_model::{KernelSwitches, ModelConfig, Switch};

    use super::*;
    use crate::{Sampler, SamplingParams};

    /// `kernels.decode` and `kernels.cuda_graphs` on: the CPU keeps the candle step, and the
    /// samples are the same bits as with them off.
    #[test]
    fn the_cpu_path_is_unchanged_by_the_decode_switches() {
        let config = ModelConfig::from_json(
            &serde_json::json!({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 128,
                "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "max_position_embeddings": 64}),
            "inline".as_ref(),
        )
        .unwrap();
        let mut model = Model::random(config, 0.05, 3, DType::F32, &Device::Cpu).unwrap();
        let params = SamplingParams {
            group_size: 3,
            max_new_tokens: 6,
            ..Default::default()
        };
        let prompts = [vec![1, 2, 3], vec![4, 5]];
        let off = Sampler::new(&model, 0);
        assert_eq!(off.decode_path(), DecodePath::default());
        let want = off.sample(&prompts, 0, &params, 7).unwrap();
        for s in [Switch::On, Switch::Auto] {
            let mut k = KernelSwitches::all(Switch::Off);
            k.decode = s;
            k.cuda_graphs = s;
            model.set_kernels(k);
            let on = Sampler::new(&model, 0);
            let path = on.decode_path();
            assert_eq!((path, path.name()), (DecodePath::default(), "candle"));
            let got = on.sample(&prompts, 0, &params, 7).unwrap();
            assert_eq!(got.len(), want.len());
            for (a, b) in got.iter().zip(&want) {
                assert_eq!(a.token_ids, b.token_ids);
                let bits = |c: &crate::Completion| -> Vec<u32> {
                    c.behaviour_logprobs.iter().map(|x| x.to_bits()).collect()
                };
                assert_eq!(bits(a), bits(b));
            }
        }
        let names = [
            DecodePath {
                fused: true,
                cuda_graphs: false,
            }
            .name(),
            DecodePath {
                fused: true,
                cuda_graphs: true,
            }
            .name(),
        ];
        assert_eq!(names, ["fused", "fused+graphs"]);
    }

    /// The decode kernels' launch recorder at the sampler level: with `kernels.decode = "on"` on
    /// the CPU, a real sampling call (two prompts of 300 and 261 tokens, so left padding masked by
    /// the bias rows and a first step of 301 keys: two splits) writes the launches of
    /// `decode_rope_kv`, `decode_attn` and `decode_attn_combine` built from the step's real
    /// tensors, with the candle step's results as the expected outputs; the completions are the
    /// plain sampler's, bit for bit. Under `RLVR_KERNEL_RECORD` (CI) the records go there and
    /// `scripts/ci_kernels.sh` replays them under Triton's interpreter.
    /// A 2-layer Qwen2-shaped model (head dim 64, GQA 2:1) with random f32 weights.
    fn small_qwen2(max_pos: usize, seed: u64) -> Model {
        let config = ModelConfig::from_json(
            &serde_json::json!({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 128,
                "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "max_position_embeddings": max_pos}),
            "inline".as_ref(),
        )
        .unwrap();
        Model::random(config, 0.05, seed, DType::F32, &Device::Cpu).unwrap()
    }

    /// `plain`'s completions, and the same sampled with the fused op `op` switched on and the
    /// launch recorder writing to `dir`: the two are asserted equal bit for bit (on the CPU the
    /// ops run the candle composition).
    fn sample_switched(
        plain: &Model,
        op: rlvr_model::FusedOp,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        seed: u64,
        dir: &std::path::Path,
    ) {
        let want = Sampler::new(plain, 0)
            .sample(prompts, 0, params, seed)
            .unwrap();
        let mut m = plain.try_clone().unwrap();
        let mut k = KernelSwitches::all(Switch::Off);
        k.set(op, Switch::On);
        m.set_kernels(k);
        let got = {
            let _guard = rlvr_model::kernels::record_launches(dir).unwrap();
            Sampler::new(&m, 0)
                .sample(prompts, 0, params, seed)
                .unwrap()
        };
        assert_eq!(got.len(), want.len());
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a.token_ids, b.token_ids);
            assert_eq!(a.behaviour_logprobs, b.behaviour_logprobs);
        }
    }

    #[test]
    fn sampler_level_launch_records_of_the_decode_kernels() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = match std::env::var_os(rlvr_kernels::triton::record::RECORD_ENV) {
            Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
            _ => tmp.path().to_path_buf(),
        };
        let plain = small_qwen2(512, 5);
        let prompts: Vec<Vec<u32>> = [300u32, 261]
            .iter()
            .map(|n| (0..*n).map(|i| (i * 7 + n) % 64).collect())
            .collect();
        let params = SamplingParams {
            group_size: 2,
            max_new_tokens: 3,
            ..Default::default()
        };
        sample_switched(
            &plain,
            rlvr_model::FusedOp::Decode,
            &prompts,
            &params,
            9,
            &dir,
        );
        let read = |kernel: &str| -> serde_json::Value {
            let rec = dir.join(format!("model_decode_{kernel}_f32_d64/record.json"));
            let text =
                std::fs::read_to_string(&rec).unwrap_or_else(|e| panic!("{}: {e}", rec.display()));
            serde_json::from_str(&text).unwrap()
        };
        // The first decode step: 4 rows, 301 keys in a 306-column cache; 2 splits.
        let rope = read("rope_kv");
        assert_eq!(rope["grid"], serde_json::json!([4, 1, 1]));
        let attn = read("attn");
        assert_eq!(attn["grid"], serde_json::json!([4, 1, 2]));
        let arg = |rec: &serde_json::Value, p: &str| -> serde_json::Value {
            let args = rec["args"].as_array().unwrap();
            args.iter().find(|a| a["param"] == p).unwrap().clone()
        };
        assert_eq!(arg(&attn, "cap")["value"], 306);
        assert_eq!(arg(&attn, "n_splits")["value"], 2);
        assert_eq!(arg(&read("attn_combine"), "n_qh")["value"], 2);
    }

    /// With `kernels.attention` on, the sampler's prefill (left-padded prompts into the empty
    /// cache) runs the fused attention, whose layers store the keys and values themselves: the
    /// completions equal the plain sampler's bit for bit (on the CPU the op is the candle
    /// composition over the same tensors), so the cache holds what the decode steps need; and
    /// the prefill's launch (two left-padded sequences) is recorded for the interpreter's replay.
    #[test]
    fn the_prefill_runs_the_fused_attention_into_the_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let plain = small_qwen2(256, 8);
        let prompts: Vec<Vec<u32>> = [37u32, 20]
            .iter()
            .map(|n| (0..*n).map(|i| (i * 5 + n) % 64).collect())
            .collect();
        let params = SamplingParams {
            group_size: 3,
            max_new_tokens: 6,
            ..Default::default()
        };
        sample_switched(
            &plain,
            rlvr_model::FusedOp::Attention,
            &prompts,
            &params,
            4,
            tmp.path(),
        );
        let (fwd, rec) = forward_record(tmp.path(), "model_attn_dense_");
        let fwd = &fwd;
        // One program row per query block of each sequence: the 37- and 20-token prompts, both
        // left-padded to 37 in a flat axis of 74 positions.
        let q = &rec["buffers"]["q"]["shape"];
        assert_eq!(q, &serde_json::json!([74, 2, 64]), "{rec}");
        // Copied under its own folder, since the training tests write a record of the same label.
        keep_record_for_ci(tmp.path(), fwd, "sampler_prefill");
    }
}
