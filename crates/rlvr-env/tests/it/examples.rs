//! The shipped calculator environment (examples/env_calculator.py; issue 45) driven through
//! rlvr's own process client exactly as a run drives it: `reset` gives the system message, the
//! question and the tool schema; a Qwen-style turn's Hermes tool calls, parsed by rlvr's parser,
//! get one `tool` message each (values, and errors for hostile or malformed expressions, quickly);
//! calls that do not parse get a `user` message; a final answer is scored against the GSM8K
//! reference; the replies render through the official Qwen2.5 template as one bridge whose text
//! is the template's grouped `<tool_response>` user turn.

use rlvr_env::bridge::bridge;
use rlvr_env::client::{ProcessEnvironment, ProcessSettings};
use rlvr_env::json::Json;
use rlvr_env::protocol::{FinishEpisode, FinishReason, ResetEpisode, StepEpisode};
use rlvr_env::template::ChatTemplate;
use rlvr_env::tools::{parse_tool_calls, ToolFormat};
use rlvr_env::Environment;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn calculator() -> ProcessEnvironment {
    let script = root().join("examples/env_calculator.py");
    let mut s = ProcessSettings::new(vec!["python3".into(), script.display().to_string()]);
    s.timeout = Duration::from_secs(20);
    s.restarts = 0;
    ProcessEnvironment::start(s).unwrap()
}

fn reset(id: &str, sample: u32, question: &str, answer: &str) -> ResetEpisode {
    ResetEpisode {
        id: id.into(),
        group: "0".into(),
        sample,
        seed: 7,
        row: Json::object([
            ("question", Json::from(question)),
            ("answer", Json::from(answer)),
        ]),
        prompt: None,
    }
}

fn step(id: &str, turn: u32, text: &str) -> StepEpisode {
    let parsed = parse_tool_calls(ToolFormat::Hermes, text);
    StepEpisode {
        id: id.into(),
        turn,
        text: text.into(),
        tool_calls: parsed.calls,
        tool_call_errors: parsed.errors,
    }
}

#[test]
fn the_calculator_environment_answers_tool_calls_and_scores_the_final_answer() {
    let mut env = calculator();
    let q = "Natalia sold 48 clips in April and half as many in May. How many in all?";
    let gsm = "In May she sold 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72\n#### 72";
    let r = env
        .reset(&[reset("0:0", 0, q, gsm), reset("0:1", 1, q, gsm)])
        .unwrap();
    let a = r[0].as_ref().unwrap();
    assert_eq!(r[1].as_ref().unwrap(), a, "the K replies of a group agree");
    let msgs = a.messages.as_ref().unwrap();
    assert_eq!(
        msgs.iter().map(|m| m.role.as_str()).collect::<Vec<_>>(),
        ["system", "user"]
    );
    assert_eq!(msgs[1].content, q);
    let tools = a.tools.as_ref().unwrap();
    let f = tools[0].get("function").unwrap();
    assert_eq!(f.get("name").and_then(Json::as_str), Some("calculator"));

    // Turn 1: two calls (one hostile) and one that does not parse; turn 1 of the other episode:
    // a wrong final answer.
    let turn1 = "I will compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": \
                 {\"expression\": \"48 + 48 / 2\"}}\n</tool_call>\n<tool_call>\n{\"name\": \
                 \"calculator\", \"arguments\": {\"expression\": \"9**9**9\"}}\n</tool_call>\n\
                 <tool_call>\n{\"name\": \"calculator\", \"arguments\": \n</tool_call>";
    let s = step("0:0", 1, turn1);
    assert_eq!((s.tool_calls.len(), s.tool_call_errors.len()), (2, 1));
    let t0 = Instant::now();
    let out = env.step(&[s, step("0:1", 1, "It is 70 clips.")]).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let r0 = out[0].as_ref().unwrap();
    assert!(!r0.done);
    assert_eq!(r0.reward, Some(0.0));
    let got: Vec<(&str, Option<&str>, &str)> = r0
        .messages
        .iter()
        .map(|m| {
            (
                m.role.as_str(),
                m.tool_call_id.as_deref(),
                m.content.as_str(),
            )
        })
        .collect();
    assert_eq!(got[0], ("tool", Some("call_0"), "72"));
    assert_eq!(
        got[1],
        (
            "tool",
            Some("call_1"),
            "error: exponent 387420489 is too large (at most 64)"
        )
    );
    assert_eq!(got[2].0, "user");
    assert!(
        got[2].2.starts_with("Your tool call did not parse: "),
        "{got:?}"
    );
    let r1 = out[1].as_ref().unwrap();
    assert!(r1.done && r1.messages.is_empty());
    assert_eq!(r1.reward, Some(0.0), "70 is not 72");

    // The tool replies as a bridge of the official Qwen2.5 template: consecutive tool messages
    // grouped into one user turn of <tool_response> blocks, then the generation prompt.
    let source = std::fs::read_to_string(root().join("data/chat_templates/qwen2_5.jinja")).unwrap();
    let template = ChatTemplate::new(&source, vec![]).unwrap();
    let tok =
        tokenizers::Tokenizer::from_file(root().join("data/tokenizers/qwen2.5/tokenizer.json"))
            .unwrap();
    let enc = |t: &str| -> Result<Vec<u32>, String> {
        Ok(tok
            .encode(t, false)
            .map_err(|e| e.to_string())?
            .get_ids()
            .to_vec())
    };
    let tool_msgs: Vec<_> = r0.messages[..2].to_vec();
    let b = bridge(&template, "<|im_end|>", &tool_msgs, Some(tools), &enc).unwrap();
    assert_eq!(
        b.text,
        "\n<|im_start|>user\n<tool_response>\n72\n</tool_response>\n<tool_response>\nerror: \
         exponent 387420489 is too large (at most 64)\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n"
    );

    // Turn 2: the final answer; then finish pays nothing.
    let out = env
        .step(&[step("0:0", 2, "So she sold 72 clips.")])
        .unwrap();
    let r = out[0].as_ref().unwrap();
    assert!(r.done);
    assert_eq!(r.reward, Some(1.0));
    let fin = env
        .finish(&[FinishEpisode {
            id: "0:1".into(),
            reason: FinishReason::MaxTurns,
        }])
        .unwrap();
    assert_eq!(fin[0].as_ref().unwrap().reward, Some(0.0));
    // An episode the environment never saw is a per-episode error, not a dead process.
    let out = env.step(&[step("9:9", 1, "1")]).unwrap();
    assert!(out[0].as_ref().unwrap_err().contains("unknown episode"));
}
