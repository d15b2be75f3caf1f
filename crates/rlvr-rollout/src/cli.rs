//! `rlvr generate` (placeholder).
