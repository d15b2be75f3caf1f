//! The fused decode step on the host: [`StepProgram::run_host`] (the program's emulation in f32,
//! each kernel as its Python source specifies, with the launch recorder), its buffers, and
//! [`HostStep`], the [`FusedStep`] the CPU tests run the sampler's fused path with.

use super::*;

impl StepProgram {
    /// Runs the program on the host in f32 over `bufs` (every buffer of [`Self::buffers`]:
    /// floats in `bufs.f`, the i32 ones in `bufs.i`), each kernel as its Python source
    /// specifies and each projection as a plain product (f64 sums). With `recorder`, the first
    /// launch of each kernel is written as a record (label `fused_step_<variant>`): its buffers
    /// as they were before the launch, and the emulation's results as the expected outputs.
    ///
    /// Errors: a buffer missing or of the wrong length; a record that cannot be written.
    pub fn run_host(&self, bufs: &mut HostBufs, recorder: Option<&Recorder>) -> Result<()> {
        let sizes = self.sizes();
        for (b, (dt, n)) in &sizes {
            let have = if *dt == triton::DType::I32 {
                bufs.i.get(b).map(Vec::len)
            } else {
                bufs.f.get(b).map(Vec::len)
            };
            if have != Some(*n) {
                return Err(ModelError::Invalid(format!(
                    "fused step on the host: buffer {b:?} holds {have:?} elements, {n} needed"
                ))
                .into());
            }
        }
        let mut recorded = BTreeSet::new();
        for op in &self.ops {
            match op {
                Op::Gemm {
                    x,
                    w,
                    bias,
                    out,
                    m,
                    n,
                    k,
                    alpha,
                    accumulate,
                } => {
                    let (xv, wv) = (&bufs.f[x], &bufs.f[w]);
                    let bv = bias.map(|b| &bufs.f[&b]);
                    let mut o = match accumulate {
                        true => bufs.f[out].clone(),
                        false => vec![0f32; m * n],
                    };
                    for r in 0..*m {
                        for c in 0..*n {
                            let dot: f64 = (0..*k)
                                .map(|j| xv[r * k + j] as f64 * wv[c * k + j] as f64)
                                .sum();
                            let before = if *accumulate {
                                o[r * n + c] as f64
                            } else {
                                0.0
                            };
                            o[r * n + c] = (*alpha as f64 * dot
                                + bv.map_or(0.0, |b| b[c] as f64)
                                + before) as f32;
                        }
                    }
                    bufs.f.insert(*out, o);
                }
                Op::Launch { plan, bind } => {
                    let before = (recorder.is_some() && !recorded.contains(&plan.name))
                        .then(|| bufs.clone());
                    self.emulate(plan, bind, bufs)?;
                    if let (Some(rec), Some(before)) = (recorder, before) {
                        self.record(rec, plan, bind, &before, bufs)?;
                        recorded.insert(plan.name.clone());
                    }
                }
            }
        }
        Ok(())
    }

    /// One kernel on the host.
    fn emulate(
        &self,
        plan: &LaunchPlan,
        bind: &[(String, Buf)],
        bufs: &mut HostBufs,
    ) -> Result<()> {
        let s = &self.shape;
        let b = |name: &str| -> Buf {
            bind.iter()
                .find(|(n, _)| n == name)
                .map(|(_, b)| *b)
                .expect("the program binds every buffer its plans name")
        };
        let (rows, hd, hq, hk) = (s.rows, s.head_dim, s.q_heads, s.kv_heads);
        let cap = s.capacity;
        match plan.entry.as_str() {
            "rmsnorm_fwd_kernel" | "rmsnorm_add_fwd_kernel" => {
                let add = plan.entry == "rmsnorm_add_fwd_kernel";
                // Rows of the weight's length: the hidden size, or a head (Qwen3's q/k norms).
                let h = bufs.f[&b("w")].len();
                let rows = bufs.f[&b("x")].len() / h;
                let mut hv = bufs.f[&b("x")].clone();
                if add {
                    for (a, r) in hv.iter_mut().zip(&bufs.f[&b("residual")]) {
                        *a += r;
                    }
                }
                let w = &bufs.f[&b("w")];
                let (mut y, mut rstd) = (vec![0f32; rows * h], vec![0f32; rows]);
                for r in 0..rows {
                    let row = &hv[r * h..(r + 1) * h];
                    let ms: f64 = row.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / h as f64;
                    let rs = 1.0 / (ms + s.eps as f64).sqrt();
                    rstd[r] = rs as f32;
                    for c in 0..h {
                        y[r * h + c] = (row[c] as f64 * rs * w[c] as f64) as f32;
                    }
                }
                if add {
                    bufs.f.insert(b("h_out"), hv);
                }
                bufs.f.insert(b("y"), y);
                bufs.f.insert(b("rstd"), rstd);
            }
            "swiglu_fwd_kernel" => {
                let (g, u) = (&bufs.f[&b("g")], &bufs.f[&b("u")]);
                let a = (g.iter().zip(u))
                    .map(|(g, u)| {
                        let g = *g as f64;
                        (g / (1.0 + (-g).exp()) * *u as f64) as f32
                    })
                    .collect();
                bufs.f.insert(b("a"), a);
            }
            "decode_rope_kv_kernel" => {
                let half = hd / 2;
                let (pos, cols) = (bufs.i[&b("pos")].clone(), bufs.i[&b("cols")].clone());
                let (cos, sin) = (&bufs.f[&b("cos")], &bufs.f[&b("sin")]);
                let rot = |x: &[f32], p: usize| -> Vec<f32> {
                    let (c, sn) = (&cos[p * hd..(p + 1) * hd], &sin[p * hd..(p + 1) * hd]);
                    let mut y = vec![0f32; hd];
                    for j in 0..half {
                        y[j] = x[j] * c[j] + (-x[j + half]) * sn[j];
                        y[j + half] = x[j + half] * c[j + half] + x[j] * sn[j + half];
                    }
                    y
                };
                let mut q_out = vec![0f32; rows * hq * hd];
                let (mut kc, mut vc) =
                    (bufs.f[&b("k_cache")].clone(), bufs.f[&b("v_cache")].clone());
                let (q, k, v) = (&bufs.f[&b("q")], &bufs.f[&b("k")], &bufs.f[&b("v")]);
                for r in 0..rows {
                    let p = pos[r] as usize;
                    for h in 0..hq {
                        let at = (r * hq + h) * hd;
                        q_out[at..at + hd].copy_from_slice(&rot(&q[at..at + hd], p));
                    }
                    let col = cols[r] as usize;
                    for h in 0..hk {
                        let src = (r * hk + h) * hd;
                        let dst = ((r * hk + h) * cap + col) * hd;
                        kc[dst..dst + hd].copy_from_slice(&rot(&k[src..src + hd], p));
                        vc[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
                    }
                }
                bufs.f.insert(b("q_out"), q_out);
                bufs.f.insert(b("k_cache"), kc);
                bufs.f.insert(b("v_cache"), vc);
            }
            "decode_attn_kernel" => {
                let ns = self.n_splits;
                let rep = hq / hk;
                let scale = 1.0 / (hd as f64).sqrt();
                let lens = &bufs.i[&b("lens")];
                let (q, kc, vc) = (
                    &bufs.f[&b("q_out")],
                    &bufs.f[&b("k_cache")],
                    &bufs.f[&b("v_cache")],
                );
                let bias = &bufs.f[&b("bias")];
                let mut o_part = bufs.f[&b("o_part")].clone();
                let mut lse_part = bufs.f[&b("lse_part")].clone();
                for r in 0..rows {
                    let len = lens[r] as usize;
                    let span = self.split.split_len(len);
                    for h in 0..hq {
                        let qi = (r * hq + h) * hd;
                        let kv = |j: usize| ((r * hk + h / rep) * cap + j) * hd;
                        let sc: Vec<f64> = (0..len)
                            .map(|j| {
                                let dot: f64 = (0..hd)
                                    .map(|x| q[qi + x] as f64 * kc[kv(j) + x] as f64)
                                    .sum();
                                dot * scale + bias[r * cap + j] as f64
                            })
                            .collect();
                        for sp in 0..self.split.splits(len) {
                            let (lo, hi) = (sp * span, ((sp + 1) * span).min(len));
                            let m = sc[lo..hi].iter().fold(f64::NEG_INFINITY, |a, x| a.max(*x));
                            let z: f64 = sc[lo..hi].iter().map(|x| (x - m).exp()).sum();
                            let row = (r * hq + h) * ns + sp;
                            for x in 0..hd {
                                let acc: f64 = (lo..hi)
                                    .map(|j| (sc[j] - m).exp() * vc[kv(j) + x] as f64)
                                    .sum();
                                o_part[row * hd + x] = (acc / z) as f32;
                            }
                            lse_part[row] = ((m + z.ln()) * std::f64::consts::LOG2_E) as f32;
                        }
                    }
                }
                bufs.f.insert(b("o_part"), o_part);
                bufs.f.insert(b("lse_part"), lse_part);
            }
            "decode_attn_combine_kernel" => {
                let ns = self.n_splits;
                let lens = &bufs.i[&b("lens")];
                let (op, lp) = (&bufs.f[&b("o_part")], &bufs.f[&b("lse_part")]);
                let mut o = vec![0f32; rows * hq * hd];
                for r in 0..rows {
                    let n = self.split.splits(lens[r] as usize);
                    for h in 0..hq {
                        let base = (r * hq + h) * ns;
                        let m = (0..n)
                            .map(|i| lp[base + i] as f64)
                            .fold(f64::NEG_INFINITY, f64::max);
                        let wts: Vec<f64> =
                            (0..n).map(|i| (lp[base + i] as f64 - m).exp2()).collect();
                        let z: f64 = wts.iter().sum();
                        for x in 0..hd {
                            let acc: f64 = (0..n)
                                .map(|i| wts[i] * op[(base + i) * hd + x] as f64)
                                .sum();
                            o[(r * hq + h) * hd + x] = (acc / z) as f32;
                        }
                    }
                }
                bufs.f.insert(b("o"), o);
            }
            other => {
                return Err(ModelError::Invalid(format!(
                    "fused step on the host: no emulation of {other}"
                ))
                .into())
            }
        }
        Ok(())
    }

    /// Writes the launch of `plan` as a record: inputs from `before`, expected outputs from
    /// `after` (what the kernel writes).
    fn record(
        &self,
        rec: &Recorder,
        plan: &LaunchPlan,
        bind: &[(String, Buf)],
        before: &HostBufs,
        after: &HostBufs,
    ) -> Result<()> {
        let m = Manifest::committed().map_err(|e| ModelError::Invalid(e.to_string()))?;
        let entry =
            (m.entry(&plan.name, plan.target)).map_err(|e| ModelError::Invalid(e.to_string()))?;
        let host = |b: &Buf, from: &HostBufs| -> HostBuffer {
            let (dt, sh) = match b {
                // Weights by their own shape; everything else by the program's.
                Buf::W(w) => (triton::DType::Fp32, self.shape.weight_shape(*w)),
                _ => {
                    let (dt, sh) = self.shape.spec(*b, self.n_splits);
                    (
                        if dt == triton::DType::I32 {
                            dt
                        } else {
                            triton::DType::Fp32
                        },
                        sh,
                    )
                }
            };
            if dt == triton::DType::I32 {
                HostBuffer::i32(&sh, &from.i[b])
            } else {
                HostBuffer::f32(&sh, &from.f[b])
            }
        };
        let buffers: BTreeMap<String, HostBuffer> = (bind.iter())
            .map(|(n, b)| (n.clone(), host(b, before)))
            .collect();
        let outs = written(&plan.entry);
        let expected: BTreeMap<String, (HostBuffer, Tolerance)> = (bind.iter())
            .filter(|(n, _)| outs.contains(&n.as_str()))
            .map(|(n, b)| (n.clone(), (host(b, after), Tolerance::F32)))
            .collect();
        rec.record(
            &format!("fused_step_{}", plan.name),
            entry,
            plan,
            &buffers,
            &expected,
        )
        .map_err(|e| ModelError::Invalid(e.to_string()))?;
        Ok(())
    }
}

/// The host buffers of [`StepProgram::run_host`]: floats (any dtype, held as f32) and i32s.
#[derive(Clone, Debug, Default)]
pub struct HostBufs {
    /// Float buffers.
    pub f: BTreeMap<Buf, Vec<f32>>,
    /// i32 buffers (`Pos`, `Cols`, `Lens`).
    pub i: BTreeMap<Buf, Vec<i32>>,
}

/// The host copy of every weight `program` names, from `model`.
///
/// Errors: a weight the model lacks (a layout the program does not match), tensor errors.
pub fn host_weights(model: &Model, program: &StepProgram) -> Result<BTreeMap<Buf, Vec<f32>>> {
    let mut out = BTreeMap::new();
    for b in program.buffers() {
        if let Buf::W(w) = b {
            out.insert(
                b,
                weight(model, w)?
                    .flatten_all()?
                    .to_dtype(DType::F32)?
                    .to_vec1()?,
            );
        }
    }
    Ok(out)
}

/// [`FusedStep`] on the host ([`StepProgram::run_host`]): the orchestration of the fused path
/// (slots, columns, lengths, the program) run on the CPU, for tests.
#[cfg(test)]
pub(crate) struct HostStep {
    program: StepProgram,
    bufs: HostBufs,
    embed: Tensor,
    /// Launch records of the first step go here, when set.
    pub(crate) recorder: Option<Recorder>,
}

#[cfg(test)]
impl HostStep {
    /// The host step of `model` over `cache` (its prefilled contents copied).
    ///
    /// Errors: what [`StepShape::of`] and [`StepProgram::build`] refuse, tensor errors.
    pub(crate) fn new(model: &Model, cache: &KvBuffer) -> Result<Self> {
        let m = Manifest::committed().map_err(|e| ModelError::Invalid(e.to_string()))?;
        let shape = StepShape::of(model, cache.rows(), cache.capacity())?;
        let program = StepProgram::build(shape, m, Target::Sm90a)?;
        let mut bufs = HostBufs::default();
        bufs.f.extend(host_weights(model, &program)?);
        let (cos, sin) = rotary_tables(model)?;
        let host = |t: &Tensor| -> Result<Vec<f32>> {
            Ok(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?)
        };
        bufs.f.insert(Buf::Cos, host(&cos)?);
        bufs.f.insert(Buf::Sin, host(&sin)?);
        bufs.f.insert(Buf::Bias, host(cache.bias_rows())?);
        bufs.f.insert(Buf::Ones, vec![1.0; shape.rows]);
        for l in 0..shape.layers {
            let (k, v) = cache
                .layer(l)
                .ok_or_else(|| ModelError::Invalid(format!("KV cache has no layer {l}")))?;
            bufs.f.insert(Buf::KCache(l), host(k)?);
            bufs.f.insert(Buf::VCache(l), host(v)?);
        }
        for (b, (dt, n)) in program.sizes() {
            if dt == triton::DType::I32 {
                bufs.i.insert(b, vec![0; n]);
            } else {
                bufs.f.entry(b).or_insert_with(|| vec![0.0; n]);
            }
        }
        let embed = weight_named(model, "model.embed_tokens.weight")?;
        Ok(HostStep {
            program,
            bufs,
            embed,
            recorder: None,
        })
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: this thread's next [`HostStep`] step fails once `HOST_STEPS` reaches this count.
    pub(crate) static HOST_FAIL_AT: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
    /// Steps run by [`HostStep`]s on this thread (tests: the fused path was taken). Per thread,
    /// as `HOST_FUSED` is, so that tests running side by side do not count each other's steps.
    pub(crate) static HOST_STEPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
impl FusedStep for HostStep {
    fn step(&mut self, cache: &mut KvBuffer, ids: &[u32], pos: &[u32]) -> Result<Tensor> {
        if HOST_FAIL_AT.with(|f| f.get() == Some(HOST_STEPS.with(std::cell::Cell::get))) {
            return Err(ModelError::Invalid("a host step made to fail (test)".into()).into());
        }
        let s = self.program.shape;
        let col = cache.len();
        let idx = Tensor::from_slice(ids, ids.len(), self.embed.device())?;
        let x = self.embed.index_select(&idx, 0)?.to_dtype(DType::F32)?;
        self.bufs.f.insert(Buf::X(0), x.flatten_all()?.to_vec1()?);
        self.bufs
            .i
            .insert(Buf::Pos, pos.iter().map(|p| *p as i32).collect());
        self.bufs.i.insert(Buf::Cols, vec![col as i32; s.rows]);
        self.bufs.i.insert(Buf::Lens, vec![col as i32 + 1; s.rows]);
        let rec = self.recorder.take();
        self.program.run_host(&mut self.bufs, rec.as_ref())?;
        HOST_STEPS.with(|c| c.set(c.get() + 1));
        rlvr_model::KvStore::commit(cache, 1)?;
        let logits = self.bufs.f[&Buf::Logits].clone();
        Ok(Tensor::from_vec(
            logits,
            (s.rows, s.vocab),
            self.embed.device(),
        )?)
    }

    fn flush(&mut self, cache: &mut KvBuffer) -> Result<()> {
        for l in 0..self.program.shape.layers {
            let (k, _) = cache
                .layer(l)
                .ok_or_else(|| ModelError::Invalid(format!("KV cache has no layer {l}")))?;
            let (dims, dtype, dev) = (k.dims().to_vec(), k.dtype(), k.device().clone());
            let back = |b: Buf| -> Result<Tensor> {
                let t = Tensor::from_slice(&self.bufs.f[&b], dims.as_slice(), &dev)?;
                Ok(t.to_dtype(dtype)?)
            };
            cache.set_layer(l, back(Buf::KCache(l))?, back(Buf::VCache(l))?)?;
        }
        Ok(())
    }
}

/// Tests: the fused path on the host ([`HostStep`]) when this thread asked for it
/// (`HOST_FUSED`); `None` otherwise, and always outside tests.
///
/// Errors: [`HostStep::new`]'s.
pub(crate) fn host_step(model: &Model, cache: &KvBuffer) -> Result<Option<Box<dyn FusedStep>>> {
    #[cfg(test)]
    if HOST_FUSED.with(std::cell::Cell::get) {
        return Ok(Some(Box::new(HostStep::new(model, cache)?)));
    }
    let _ = (model, cache);
    Ok(None)
}

#[cfg(test)]
thread_local! {
    /// Tests: this thread's samplers run the fused path on the host.
    pub(crate) static HOST_FUSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
