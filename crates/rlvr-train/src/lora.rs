//! LoRA in a run (the `model.lora_*` keys; the adapters themselves are `rlvr_model::lora`):
//! attaching fresh adapters to the loaded policy, the KL reference that shares the frozen base,
//! and `rlvr merge`, which folds a checkpoint's adapter into a full HuggingFace model.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use candle_core::{DType, Device};
use clap::Args;
use rlvr_model::checkpoint::write_tokenizer_files;
use rlvr_model::{LoraConfig, Model, TokenizerBundle};

/// Makes `model` (loaded from `dir`: `model.path`, or a checkpoint on resume) match the run's LoRA
/// settings: fresh adapters (seeded by `seed`) when `model.lora_rank` ≥ 1 and `dir` holds none;
/// the loaded adapters when their settings equal the config's.
///
/// # Errors
/// `dir` holds an adapter but LoRA is off, or its settings differ from the config's (both named).
pub fn attach(
    model: &mut Model,
    lora: Option<LoraConfig>,
    dir: &Path,
    seed: u64,
) -> anyhow::Result<()> {
    // `all-linear` as the architecture's projections, the targets checked against its modules.
    let lora = lora
        .map(|c| c.for_arch(model.config().arch))
        .transpose()
        .context("model.lora_targets")?;
    match (lora, model.lora_config().cloned()) {
        (None, None) => Ok(()),
        (None, Some(l)) => bail!(
            "{} holds a LoRA adapter (r = {}) but model.lora_rank = 0; set model.lora_rank = {} \
             (and the other model.lora_* keys as in its adapter_config.json) to keep training it, \
             or fold it into a full model first: rlvr merge --checkpoint {} --out DIR",
            dir.display(),
            l.rank,
            l.rank,
            dir.display()
        ),
        (Some(c), None) => {
            let hidden = model.config().hidden_size;
            if c.rank > hidden {
                bail!(
                    "model.lora_rank = {} is out of range: at most the hidden size of {}, {hidden} \
                     (a rank-r adapter of a width-{hidden} projection is full rank at r = {hidden})",
                    c.rank,
                    dir.display()
                );
            }
            model
                .add_lora(&c, seed)
                .context("model.lora_*: attaching LoRA adapters")
        }
        (Some(c), Some(l)) if same(&c, &l) => Ok(()),
        (Some(c), Some(l)) => bail!(
            "{} holds a LoRA adapter with r = {}, alpha = {}, targets {:?}, dropout {}, but the \
             config asks for r = {}, alpha = {}, targets {:?}, dropout {} (model.lora_*)",
            dir.display(),
            l.rank,
            l.alpha,
            l.targets,
            l.dropout,
            c.rank,
            c.alpha,
            c.targets,
            c.dropout
        ),
    }
}

/// Equal settings, the target order aside.
fn same(a: &LoraConfig, b: &LoraConfig) -> bool {
    a.rank == b.rank
        && a.alpha == b.alpha
        && a.dropout == b.dropout
        && a.targets.len() == b.targets.len()
        && a.targets.iter().all(|t| b.targets.contains(t))
}

/// The KL reference of a LoRA run without `model.reference` (`own_reference` false): the policy's
/// base with the adapters off, sharing its storage (the initial policy, when `model_path` holds no
/// adapter of its own). `None` otherwise (the caller loads the reference from disk).
pub fn shared_reference(policy: &Model, model_path: &Path, own_reference: bool) -> Option<Model> {
    let own_adapter = rlvr_model::lora::find_adapter(model_path).is_some();
    (!own_reference && policy.lora_config().is_some() && !own_adapter)
        .then(|| policy.without_adapters())
}

/// `rlvr merge`: fold a checkpoint's LoRA adapter into a full HuggingFace model.
#[derive(Args, Debug, Clone)]
pub struct MergeArgs {
    /// A model directory with an adapter: an rlvr checkpoint (`adapter/` inside) or a PEFT
    /// adapter directory (`adapter_config.json` naming its base).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Output model directory (config.json, model.safetensors, tokenizer files); a non-empty one
    /// is refused unless `--force`.
    #[arg(long)]
    pub out: PathBuf,
    /// Write into a non-empty `--out` (its `*.safetensors` files are removed first).
    #[arg(long)]
    pub force: bool,
}

/// Refuses an `--out` that is the base model the adapter in `adapter` (of `checkpoint`) names
/// (`base_model_name_or_path`, relative to `checkpoint` when relative, as the loader reads it):
/// merging into it would replace the weights every checkpoint of the run applies its adapter to.
fn refuse_base_as_out(checkpoint: &Path, adapter: &Path, out: &Path) -> anyhow::Result<()> {
    let Ok((_, Some(base))) = rlvr_model::lora::read_adapter_config(adapter) else {
        return Ok(()); // no base named: the loader's own error says so
    };
    let base = if base.is_absolute() {
        base
    } else {
        checkpoint.join(base)
    };
    if let (Ok(b), Ok(o)) = (base.canonicalize(), out.canonicalize()) {
        anyhow::ensure!(
            b != o,
            "--out {} is the adapter's base model ({} names it as base_model_name_or_path): \
             merging there would replace the weights that this adapter, and every other \
             checkpoint of its run, is applied to (--force does not change this); choose another \
             --out",
            out.display(),
            adapter.join("adapter_config.json").display()
        );
    }
    Ok(())
}

/// Runs `rlvr merge`: loads the base and the adapter in f32, writes `W + (α/r)·B·A` for every
/// adapted projection (peft's `merge_and_unload`), cast to the base's stored dtype
/// (`torch_dtype` of its config.json), with the tokenizer files of `--checkpoint`; prints
/// `{"out", "dtype", "merged"}`.
///
/// # Errors
/// No adapter in `--checkpoint`, an `--out` that is the checkpoint or the adapter's base model
/// (even with `--force`), a non-empty `--out` without `--force`, load and I/O errors.
pub fn run_merge(a: &MergeArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    crate::store::lock::refuse_same_dir(&a.checkpoint, &a.out)?;
    let Some(adapter) = rlvr_model::lora::find_adapter(&a.checkpoint) else {
        bail!(
            "{} holds no LoRA adapter (adapter/adapter_config.json or adapter_config.json); it \
             already is a full model",
            a.checkpoint.display()
        );
    };
    refuse_base_as_out(&a.checkpoint, &adapter, &a.out)?;
    // --force over a model: written into a staging sibling, moved over --out only when complete.
    let staged = crate::store::lock::StagedOutput::prepare(&a.out, a.force, "--out")?;
    let model = crate::store::manifest::load_model(&a.checkpoint, DType::F32, &Device::Cpu)?;
    let n = model.named_vars().len() / 2;
    let merged = model.merged()?;
    let dtype = match merged.config().stored_dtype.as_deref() {
        Some("bfloat16") => DType::BF16,
        Some("float16") => DType::F16,
        _ => DType::F32,
    };
    merged
        .save(staged.path(), dtype)
        .with_context(|| format!("writing {}", staged.path().display()))?;
    let tok = TokenizerBundle::load(&a.checkpoint)
        .with_context(|| format!("loading the tokenizer of {}", a.checkpoint.display()))?;
    write_tokenizer_files(staged.path(), &tok)?;
    staged.commit()?;
    writeln!(
        out,
        "{}",
        serde_json::json!({"out": a.out, "dtype": format!("{dtype:?}").to_lowercase(), "merged": n})
    )?;
    Ok(())
}
