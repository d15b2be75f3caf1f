//! Reading and writing safetensors checkpoints: a single `model.safetensors` or shards listed by
//! `model.safetensors.index.json`, stored in f32, bf16 or f16.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;
use safetensors::SafeTensors;

use crate::error::{ModelError, Result};

/// The memory-mapped safetensors files of one checkpoint and which file holds each tensor.
pub struct WeightFiles {
    files: Vec<(PathBuf, Mmap)>,
    /// tensor name -> index into `files`
    index: HashMap<String, usize>,
    /// What error messages name as the source: the index file for sharded checkpoints.
    origin: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |err| ModelError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// Maps `path` read-only, after refusing a file that is not regular (a FIFO would block the open).
fn mmap(path: &Path) -> Result<Mmap> {
    crate::error::check_regular_file(path)?;
    let f = std::fs::File::open(path).map_err(io(path))?;
    // SAFETY: the file is opened read-only; rlvr never writes a checkpoint in place (writes go to
    // a temporary file that is renamed), so the mapping is not modified while it is alive.
    unsafe { Mmap::map(&f) }.map_err(io(path))
}

/// The tensor names of safetensors file `path` (its header only is parsed; the file is mapped,
/// not read).
///
/// Errors: the file is missing or not regular, or not valid safetensors.
pub(crate) fn tensor_names(path: &Path) -> Result<Vec<String>> {
    let m = mmap(path)?;
    let st = SafeTensors::deserialize(&m).map_err(|e| ModelError::Safetensors {
        file: path.to_path_buf(),
        msg: e.to_string(),
    })?;
    Ok(st.names().into_iter().map(str::to_string).collect())
}

impl WeightFiles {
    /// Opens the weights of the model directory `dir`: `model.safetensors`, or the shards named by
    /// `model.safetensors.index.json` (`weight_map`).
    ///
    /// Errors: neither file exists; one is not a regular file (a FIFO, whose open would block for
    /// ever; a directory; a device); the index is malformed or names a missing shard; a shard is
    /// not valid safetensors.
    pub fn open(dir: &Path) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let mut files = Vec::new();
        let mut index = HashMap::new();
        let origin;
        if single.exists() {
            let m = mmap(&single)?;
            let st = SafeTensors::deserialize(&m).map_err(|e| ModelError::Safetensors {
                file: single.clone(),
                msg: e.to_string(),
            })?;
            for name in st.names() {
                index.insert(name.to_string(), 0);
            }
            files.push((single.clone(), m));
            origin = single;
        } else if index_path.exists() {
            crate::error::check_regular_file(&index_path)?;
            let text = std::fs::read_to_string(&index_path).map_err(io(&index_path))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::Config {
                    file: index_path.clone(),
                    msg: format!("not valid JSON: {e}"),
                })?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::Config {
                    file: index_path.clone(),
                    msg: "field `weight_map` is missing or not an object".into(),
                })?;
            let mut shard_ids: HashMap<String, usize> = HashMap::new();
            for (tensor, shard) in map {
                let shard = shard.as_str().ok_or_else(|| ModelError::Config {
                    file: index_path.clone(),
                    msg: format!("`weight_map.{tensor}` is not a file name"),
                })?;
                let id = match shard_ids.get(shard) {
                    Some(&id) => id,
                    None => {
                        let p = dir.join(shard);
                        if !p.exists() {
                            return Err(ModelError::MissingFile {
                                path: p,
                                what: format!(
                                    "shard named by {} for tensor `{tensor}`",
                                    index_path.display()
                                ),
                            });
                        }
                        let m = mmap(&p)?;
                        SafeTensors::deserialize(&m).map_err(|e| ModelError::Safetensors {
                            file: p.clone(),
                            msg: e.to_string(),
                        })?;
                        files.push((p, m));
                        shard_ids.insert(shard.to_string(), files.len() - 1);
                        files.len() - 1
                    }
                };
                index.insert(tensor.clone(), id);
            }
            origin = index_path;
        } else {
            return Err(ModelError::MissingFile {
                path: single,
                what: "model weights: neither model.safetensors nor model.safetensors.index.json"
                    .into(),
            });
        }
        Ok(Self {
            files,
            index,
            origin,
        })
    }

    /// Refuses a checkpoint holding tensors the model did not load (`used`: every name it asked
    /// for), other than those transformers ignores too (`lm_head.weight` beside tied embeddings,
    /// the rotary `inv_freq` buffers of older checkpoints): the config.json at `config` describes
    /// a different model than the weights (e.g. `num_hidden_layers` edited down), and loading
    /// would silently drop part of it.
    ///
    /// Errors: [`ModelError::UnexpectedTensor`] naming the weights file, the first such tensor
    /// (layers in numeric order), how many there are, and `config`.
    pub fn refuse_unused(&self, used: &HashSet<String>, config: &Path) -> Result<()> {
        let ignored = |k: &str| {
            k == "lm_head.weight"
                || k == "language_model.lm_head.weight"
                || k.ends_with(".rotary_emb.inv_freq")
        };
        let mut extra: Vec<&String> = self
            .index
            .keys()
            .filter(|k| !used.contains(*k) && !ignored(k.as_str()))
            .collect();
        if extra.is_empty() {
            return Ok(());
        }
        extra.sort_by_cached_key(|k| natural_key(k));
        Err(ModelError::UnexpectedTensor {
            file: self.origin.clone(),
            tensor: extra[0].clone(),
            count: extra.len(),
            config: config.to_path_buf(),
        })
    }

    /// The names of every tensor of the checkpoint (in no particular order).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// Whether the checkpoint holds a tensor of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Loads tensor `name`, checks its shape, and converts it to `dtype` on `device`.
    ///
    /// Errors: the tensor is missing ([`ModelError::MissingTensor`]), has another shape
    /// ([`ModelError::ShapeMismatch`]) or an unsupported dtype; each names the file.
    pub fn load(
        &self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let &fid = self
            .index
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                file: self.origin.clone(),
                tensor: name.to_string(),
            })?;
        let (path, m) = &self.files[fid];
        let st = SafeTensors::deserialize(m).map_err(|e| ModelError::Safetensors {
            file: path.clone(),
            msg: e.to_string(),
        })?;
        let view = st.tensor(name).map_err(|_| ModelError::MissingTensor {
            file: path.clone(),
            tensor: name.to_string(),
        })?;
        if view.shape() != shape {
            return Err(ModelError::ShapeMismatch {
                file: path.clone(),
                tensor: name.to_string(),
                expected: shape.to_vec(),
                found: view.shape().to_vec(),
            });
        }
        let src = match view.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::BF16 => DType::BF16,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::F64 => DType::F64,
            other => {
                return Err(ModelError::UnsupportedDtype {
                    file: path.clone(),
                    tensor: name.to_string(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        if let Some((count, first)) = non_finite(view.data(), src) {
            return Err(ModelError::NonFinite {
                file: path.clone(),
                tensor: name.to_string(),
                count,
                first,
            });
        }
        let t = Tensor::from_raw_buffer(view.data(), src, shape, &Device::Cpu)?;
        Ok(t.to_dtype(dtype)?.to_device(device)?)
    }
}

/// A tensor name's sort key: its dot-separated parts, numbers compared as numbers (so layer 2
/// comes before layer 10).
fn natural_key(name: &str) -> Vec<(u64, String)> {
    name.split('.')
        .map(|p| match p.parse::<u64>() {
            Ok(n) => (n, String::new()),
            Err(_) => (u64::MAX, p.to_string()),
        })
        .collect()
}

/// Counts the NaN/±∞ values of a little-endian buffer of `dtype` and gives the flat index of the
/// first: `None` when every value is finite. Reads the bit patterns (an all-ones exponent), so it
/// costs one pass over the bytes and no conversion.
fn non_finite(bytes: &[u8], dtype: DType) -> Option<(usize, usize)> {
    let scan = |width: usize, bad: &dyn Fn(&[u8]) -> bool| {
        let mut count = 0;
        let mut first = None;
        for (i, v) in bytes.chunks_exact(width).enumerate() {
            if bad(v) {
                count += 1;
                first.get_or_insert(i);
            }
        }
        first.map(|f| (count, f))
    };
    match dtype {
        DType::F32 => scan(4, &|v| {
            !f32::from_le_bytes(v.try_into().expect("4 bytes")).is_finite()
        }),
        DType::F64 => scan(8, &|v| {
            !f64::from_le_bytes(v.try_into().expect("8 bytes")).is_finite()
        }),
        DType::BF16 => scan(2, &|v| u16::from_le_bytes([v[0], v[1]]) & 0x7F80 == 0x7F80),
        DType::F16 => scan(2, &|v| u16::from_le_bytes([v[0], v[1]]) & 0x7C00 == 0x7C00),
        _ => None,
    }
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync, rename,
/// then fsync of the directory. A crash or a full disk leaves either the old file or the new one,
/// never a torn one.
///
/// Errors: any I/O error, naming `path`.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    rlvr_rundir::fs::atomic_write(path, bytes).map_err(io(path))
}

/// The safetensors dtype of a candle dtype.
fn safetensors_dtype(d: DType) -> Result<safetensors::Dtype> {
    use safetensors::Dtype as S;
    Ok(match d {
        DType::U8 => S::U8,
        DType::U32 => S::U32,
        DType::I16 => S::I16,
        DType::I32 => S::I32,
        DType::I64 => S::I64,
        DType::BF16 => S::BF16,
        DType::F16 => S::F16,
        DType::F32 => S::F32,
        DType::F64 => S::F64,
        other => {
            return Err(ModelError::Invalid(format!(
                "writing safetensors: dtype {other:?} is not supported"
            )))
        }
    })
}

/// `v` as compact JSON (a header field of [`write_safetensors`]).
fn to_json<T: serde::Serialize + ?Sized>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| ModelError::Invalid(format!("writing safetensors: {e}")))
}

/// Writes `xs` as little-endian bytes through a small reused buffer (1 MiB at a time).
fn write_le<T: Copy, const N: usize>(
    w: &mut dyn std::io::Write,
    xs: &[T],
    le: fn(T) -> [u8; N],
) -> std::io::Result<()> {
    let per_chunk = (1 << 20) / N;
    let mut buf = Vec::with_capacity(per_chunk * N);
    for chunk in xs.chunks(per_chunk) {
        buf.clear();
        for &x in chunk {
            buf.extend_from_slice(&le(x));
        }
        w.write_all(&buf)?;
    }
    Ok(())
}

/// Writes one contiguous CPU tensor's elements, read from its storage in place (no copy of the
/// tensor).
fn write_tensor_data(w: &mut dyn std::io::Write, t: &Tensor) -> std::io::Result<()> {
    use candle_core::{CpuStorage as C, Storage};
    let (storage, layout) = t.storage_and_layout();
    let (a, b) = layout
        .contiguous_offsets()
        .ok_or_else(|| std::io::Error::other("writing safetensors: a tensor is not contiguous"))?;
    let Storage::Cpu(cpu) = &*storage else {
        return Err(std::io::Error::other(
            "writing safetensors: a tensor is not on the CPU",
        ));
    };
    match cpu {
        C::U8(v) => w.write_all(&v[a..b]),
        C::U32(v) => write_le(w, &v[a..b], u32::to_le_bytes),
        C::I16(v) => write_le(w, &v[a..b], i16::to_le_bytes),
        C::I32(v) => write_le(w, &v[a..b], i32::to_le_bytes),
        C::I64(v) => write_le(w, &v[a..b], i64::to_le_bytes),
        C::BF16(v) => write_le(w, &v[a..b], |x| x.to_bits().to_le_bytes()),
        C::F16(v) => write_le(w, &v[a..b], |x| x.to_bits().to_le_bytes()),
        C::F32(v) => write_le(w, &v[a..b], f32::to_le_bytes),
        C::F64(v) => write_le(w, &v[a..b], f64::to_le_bytes),
        _ => Err(std::io::Error::other(format!(
            "writing safetensors: dtype {:?} is not supported",
            t.dtype()
        ))),
    }
}

/// Writes named tensors to `path` as a safetensors file (metadata `format: pt`), atomically
/// ([`rlvr_rundir::fs::atomic_write_with`]: a temporary file beside it, fsync, rename), streaming
/// each tensor's elements from its storage into the file: no buffer of the whole file and no
/// copy of a CPU tensor (a GPU tensor is copied to the CPU one at a time). The bytes are those of
/// `safetensors::serialize` (tested): the header's tensors ordered by descending dtype alignment,
/// then by name, the header padded with spaces to a multiple of 8 bytes (the format:
/// <https://github.com/huggingface/safetensors#format>).
///
/// Peak memory beyond the tensors: the header, a 1 MiB write buffer and a 1 MiB conversion
/// buffer; `safetensors_bytes` + [`atomic_write`] held the whole file (a 135 M-parameter model's
/// weights and AdamW moments in f32: 1.5 GB) plus one tensor's copy.
///
/// # Errors
/// An unsupported dtype, a non-contiguous tensor that cannot be made contiguous, any I/O error,
/// naming `path`.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let mut order: Vec<(safetensors::Dtype, &str, &Tensor)> = tensors
        .iter()
        .map(|(n, t)| Ok((safetensors_dtype(t.dtype())?, n.as_str(), t)))
        .collect::<Result<_>>()?;
    order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    // The header: {"__metadata__": {...}, NAME: {"dtype", "shape", "data_offsets"}, ...} in data
    // order; names JSON-escaped by serde_json.
    let mut header = String::from(r#"{"__metadata__":{"format":"pt"}"#);
    let mut offset = 0usize;
    for (dtype, name, t) in &order {
        let len = t.elem_count() * t.dtype().size_in_bytes();
        header.push_str(&format!(
            ",{}:{{\"dtype\":{},\"shape\":{},\"data_offsets\":[{offset},{}]}}",
            to_json(name)?,
            to_json(dtype)?,
            to_json(t.dims())?,
            offset + len
        ));
        offset += len;
    }
    header.push('}');
    let mut header = header.into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    rlvr_rundir::fs::atomic_write_with(path, &mut |w| {
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        for (_, name, t) in &order {
            let cpu = t
                .to_device(&Device::Cpu)
                .and_then(|t| t.contiguous())
                .map_err(|e| std::io::Error::other(format!("tensor {name}: {e}")))?;
            write_tensor_data(w, &cpu)?;
        }
        Ok(())
    })
    .map_err(io(path))
}

/// Serialises named tensors to safetensors bytes, in the tensors' own dtypes, names sorted.
pub fn safetensors_bytes(tensors: &[(String, Tensor)]) -> Result<Vec<u8>> {
    let mut sorted: Vec<&(String, Tensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let map: Vec<(String, Tensor)> = sorted
        .into_iter()
        .map(|(n, t)| Ok((n.clone(), t.to_device(&Device::Cpu)?.contiguous()?)))
        .collect::<Result<_>>()?;
    let mut metadata = HashMap::new();
    metadata.insert("format".to_string(), "pt".to_string());
    safetensors::serialize(map.iter().map(|(n, t)| (n.as_str(), t)), Some(metadata))
        .map_err(|e| ModelError::Invalid(format!("serialising safetensors: {e}")))
}
