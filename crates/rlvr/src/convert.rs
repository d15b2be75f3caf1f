//! `rlvr convert --from-gguf FILE.gguf --out DIR`: a GGUF file (llama.cpp, Ollama, LM Studio)
//! converted into a HuggingFace checkpoint that every rlvr command and transformers load
//! (`rlvr_model::gguf`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use candle_core::DType;

/// Arguments of `rlvr convert` (DESIGN.md section 10).
#[derive(clap::Args, Debug)]
pub struct ConvertArgs {
    /// The GGUF file to convert (architectures llama, qwen2, qwen3; a byte-level BPE vocabulary;
    /// the quantisations F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 and the K-quants).
    #[arg(long)]
    pub from_gguf: PathBuf,
    /// Output model directory (created). An existing non-empty directory is refused unless
    /// `--force`.
    #[arg(long)]
    pub out: PathBuf,
    /// Storage dtype of the dequantized weights: f32 (exact) or bf16 (half the size, rounded).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Write into a non-empty `--out` (replaced as a whole when the conversion is complete).
    #[arg(long)]
    pub force: bool,
}

/// Converts, writes the directory atomically (a staging sibling moved into place when
/// complete), prints `{"out", "architecture", "parameters", "vocab_size", "tensors", "eos_ids"}`.
///
/// # Errors
/// A `--dtype` other than f32/bf16; a non-empty `--out` without `--force`; every error of
/// `rlvr_model::gguf::read` (naming the file and the key or tensor) and of writing.
pub fn run(a: &ConvertArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let dtype = rlvr_model::parse_dtype(&a.dtype)
        .ok()
        .filter(|d| matches!(d, DType::F32 | DType::BF16))
        .with_context(|| format!("--dtype {}: expected f32 or bf16", a.dtype))?;
    let model = rlvr_model::gguf::read(&a.from_gguf)?;
    let staged = rlvr_train::store::lock::StagedOutput::prepare(&a.out, a.force, "--out")?;
    rlvr_model::gguf::write_checkpoint(&model, staged.path(), dtype)?;
    staged.commit()?;
    writeln!(
        out,
        "{}",
        serde_json::json!({
            "out": a.out.display().to_string(),
            "architecture": model.config.arch.model_type(),
            "parameters": model.config.num_parameters(),
            "vocab_size": model.config.vocab_size,
            "tensors": model.tensors.len(),
            "eos_ids": model.tokenizer.eos_ids,
        })
    )?;
    Ok(())
}
