//! The row packer: prompt + completion rows → the right-padded batch every training forward of
//! rlvr-train reads (the trainer's update, behaviour log-prob recomputation and evaluation's
//! scoring, SFT).
//!
//! Row r is `prompt ‖ completion`, padded on the right with `pad` to the longest row (at least 2
//! positions). The forward starts its output at `start` = shortest prompt − 1, the position that
//! predicts the first completion token of the shortest prompt; completion token j of row r
//! (at position P_r + j) is predicted by output column `at[r][j]` = P_r + j − 1 − `start`.

/// A packed micro-batch (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct PackedRows {
    /// `[b][T]` token ids, right-padded.
    pub ids: Vec<Vec<u32>>,
    /// `[b][T]` attention mask: 1 on real tokens, 0 on padding.
    pub mask: Vec<Vec<u32>>,
    /// First output position (shortest prompt − 1).
    pub start: usize,
    /// Per row, the output column (relative to `start`) predicting each completion token.
    pub at: Vec<Vec<usize>>,
}

impl PackedRows {
    /// Output columns per row (`T − 1 − start`): what `Model::token_logprobs` returns per row.
    pub fn columns(&self) -> usize {
        self.ids.first().map_or(0, |r| r.len() - 1 - self.start)
    }
}

/// Packs `(prompt, completion)` rows (module docs). Every prompt must hold at least one token.
pub fn pack_rows(rows: &[(&[u32], &[u32])], pad: u32) -> PackedRows {
    let t = rows
        .iter()
        .map(|(p, c)| p.len() + c.len())
        .max()
        .unwrap_or(0)
        .max(2);
    let start = rows
        .iter()
        .map(|(p, _)| p.len())
        .min()
        .unwrap_or(1)
        .saturating_sub(1);
    let mut out = PackedRows {
        ids: Vec::with_capacity(rows.len()),
        mask: Vec::with_capacity(rows.len()),
        start,
        at: Vec::with_capacity(rows.len()),
    };
    for (p, c) in rows {
        let mut row: Vec<u32> = p.to_vec();
        row.extend_from_slice(c);
        let n = row.len();
        row.resize(t, pad);
        let mut m = vec![1u32; n];
        m.resize(t, 0);
        out.ids.push(row);
        out.mask.push(m);
        // Completion token j sits at P + j and is predicted at position P + j − 1.
        out.at
            .push((0..c.len()).map(|j| p.len() + j - 1 - start).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_right_padded_and_completion_positions_are_relative_to_start() {
        let rows: Vec<(&[u32], &[u32])> = vec![(&[1, 2, 3][..], &[4, 5][..]), (&[6][..], &[7][..])];
        let p = pack_rows(&rows, 0);
        assert_eq!(p.ids, vec![vec![1, 2, 3, 4, 5], vec![6, 7, 0, 0, 0]]);
        assert_eq!(p.mask, vec![vec![1, 1, 1, 1, 1], vec![1, 1, 0, 0, 0]]);
        assert_eq!(p.start, 0);
        // Row 0: token 4 (position 3) is predicted at 2, token 5 at 3; row 1: token 7 at 0.
        assert_eq!(p.at, vec![vec![2, 3], vec![0]]);
        assert_eq!(p.columns(), 4);
    }

    #[test]
    fn a_lone_one_token_row_still_gets_two_positions() {
        let rows: Vec<(&[u32], &[u32])> = vec![(&[9][..], &[][..])];
        let p = pack_rows(&rows, 0);
        assert_eq!(
            (p.ids.clone(), p.start, p.columns()),
            (vec![vec![9, 0]], 0, 1)
        );
        assert!(p.at[0].is_empty());
    }
}
