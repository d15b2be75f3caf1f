//! The font that rlvr's figures are drawn with, built into the binary: `rlvr plot` (rlvr-train) and
//! the lab's figures (rlvr-lab) lay out their text with it, so a plot looks the same on every
//! machine and needs no system font. It is its own crate, below both, so that neither reaches into
//! the other's folder for the file and the lab stays free of the tensor crates.
//!
//! [`DEJAVU_SANS`] is DejaVu Sans (Book), a TrueType file under the Bitstream Vera licence
//! (`assets/DejaVuSans.LICENSE`, shipped beside it); plotters' `ab_glyph` backend registers it with
//! `plotters::style::register_font`.
//!
//! ```
//! // A TrueType file starts with the sfnt version 1.0.
//! assert_eq!(&rlvr_fonts::DEJAVU_SANS[..4], &[0, 1, 0, 0]);
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

/// DejaVu Sans (Book) as TrueType bytes (`assets/DejaVuSans.ttf`, Bitstream Vera licence).
pub static DEJAVU_SANS: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
