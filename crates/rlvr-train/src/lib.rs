//! Trainer of rlvr (work in progress).
#![warn(missing_docs)]
