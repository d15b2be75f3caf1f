//! The transformers references of the model fixtures (`tests/fixtures/NAME/expected.json`, written
//! by scripts/make_model_fixtures.py) as the Gemma and Phi-3 tests read them, and the loss their
//! gradient references are taken of.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use rlvr_model::Model;
use serde::Deserialize;

/// The fixture directory `tests/fixtures/NAME`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// One batch of the reference: token ids and masks `[B, T]`, transformers' log-probs `[B, T]`
/// (`None` where no token is predicted), at `temperature`.
#[derive(Deserialize)]
pub struct Case {
    pub name: String,
    pub temperature: f64,
    pub input_ids: Vec<Vec<u32>>,
    pub attention_mask: Vec<Vec<u32>>,
    pub logprobs: Vec<Vec<Option<f64>>>,
}

/// The float64 gradient of the summed log-probs of case `case` (`loss`) with respect to a few
/// stored weights (flattened rows), and those weights' shapes.
#[derive(Deserialize)]
pub struct Grads {
    pub case: String,
    pub loss: f64,
    pub weights: BTreeMap<String, Vec<f64>>,
    pub shapes: BTreeMap<String, Vec<usize>>,
}

/// transformers' greedy `generate` after `prompt` (`tokens`), and the argmax of full forwards.
#[derive(Deserialize)]
pub struct Greedy {
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    pub full_forward_argmax: Vec<u32>,
}

/// A fixture's `expected.json` (the fields these tests read).
#[derive(Deserialize)]
pub struct Expected {
    pub cases: Vec<Case>,
    pub grads: Grads,
    pub greedy: Option<Greedy>,
    pub rope_inv_freq: Vec<f64>,
    pub rope_inv_freq_local: Option<Vec<f64>>,
}

/// Reads fixture `name`'s `expected.json`. Panics when it is missing or malformed.
pub fn expected(name: &str) -> Expected {
    let text = std::fs::read_to_string(fixture(name).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The scalar L = Σ log-probs of `case`'s predicted tokens under `model` (with its graph, for
/// `backward`), the loss the `Grads` reference differentiates.
pub fn case_loss(model: &Model, case: &Case) -> Tensor {
    let out = model
        .token_logprobs(
            &case.input_ids,
            &case.attention_mask,
            0,
            case.temperature,
            false,
            true,
        )
        .unwrap();
    let valid: Vec<f32> = (case.logprobs.iter().flatten())
        .map(|x| if x.is_some() { 1.0 } else { 0.0 })
        .collect();
    let valid = Tensor::from_vec(valid, out.logprobs.dims(), &Device::Cpu).unwrap();
    (out.logprobs * valid).unwrap().sum_all().unwrap()
}
