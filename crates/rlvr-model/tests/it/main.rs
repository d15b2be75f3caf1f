//! rlvr-model's integration tests in one test binary (`it`), so that the crate's dependency stack is
//! linked once, not once per file. Each module was a `tests/<module>.rs` binary of its own; its
//! tests are named `<module>::<test>`, and
//! `cargo test --workspace --locked --test it -- <module>::` runs one module's (the filter goes to
//! every crate's `it`; `-p rlvr-model` would re-resolve features and rebuild most dependencies).
//! ARCHITECTURE.md, "Testing", says how tests that need a process of their own are run here.

mod chat_template;
mod chunked_head;
mod fused;
mod fused_adamw;
mod fused_head;
mod gemma;
mod gguf;
mod gradients;
mod long_context;
mod lora;
mod lora_parity;
mod mixed_precision;
mod model_files;
mod parity;
mod phi3;
mod reference;
mod shared_prefix;
