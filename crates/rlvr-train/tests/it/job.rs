//! The job (`rlvr_train::job`) and the binary row codec (`rlvr_train::store::wire`): a job of one
//! process is the one-process code (no collective, every value as given, the batch unchanged);
//! several ranks (threads) gather rows in rank order bit for bit and learn rank 0's decisions;
//! every row field crosses the wire bit for bit (NaN payloads, ±inf, −0.0, empty rows) and a
//! malformed message is an error, not a panic or an allocation.

use rlvr_dist::{SharedComm, ThreadComm};
use rlvr_train::job::Job;
use rlvr_train::store::experience::{Experience, RewardPart};
use rlvr_train::store::rollouts::RolloutRecord;
use rlvr_train::store::wire::{self, RowMeta};

/// A quiet NaN with a payload, and a signalling-pattern one: both must keep their bits.
const NAN_A: u32 = 0x7fc0_1234;
const NAN_B: u32 = 0xff80_0001;

fn odd_row(g: &str, i: u32) -> Experience {
    let lp = [
        f32::from_bits(NAN_A),
        f32::from_bits(NAN_B),
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        f32::MIN_POSITIVE / 2.0,
        -1e-8,
    ];
    Experience {
        prompt_ids: vec![1, u32::MAX, i],
        completion_ids: (0..lp.len() as u32).collect(),
        behaviour_logprobs: lp.to_vec(),
        reward: Some([f64::NAN, -0.0, f64::INFINITY][i as usize % 3]),
        correct: [None, Some(false), Some(true)][i as usize % 3],
        group_id: g.into(),
        version: Some(u64::MAX - u64::from(i)),
        truncated: i % 2 == 1,
        components: vec![
            RewardPart {
                name: "ü·∑".into(),
                raw: f64::from_bits(0x7ff8_0000_dead_beef),
                weighted: -0.0,
                // A verifier's extra numbers (verl's reward_extra_info) cross with the part.
                extra: [("acc".to_string(), -0.0), ("ü".into(), f64::from(i) / 3.0)].into(),
            },
            RewardPart {
                name: String::new(),
                raw: f64::NEG_INFINITY,
                weighted: 1.0 / 3.0,
                extra: Default::default(),
            },
        ],
        // A multi-turn episode's mask and turn rewards cross the gather bit for bit.
        completion_mask: i
            .is_multiple_of(2)
            .then(|| (0..lp.len()).map(|j| u8::from(j % 3 != 1)).collect()),
        turns: i.is_multiple_of(2).then_some(i + 2),
        turn_rewards: vec![
            None,
            Some(-0.0),
            Some(f64::from_bits(0x7ff8_0000_0000_0001)),
        ],
        // An episode's environment metrics cross with it.
        env_metrics: [
            ("solved".to_string(), -0.0),
            ("ü".into(), f64::from(i) / 7.0),
        ]
        .into(),
    }
}

fn empty_row() -> Experience {
    Experience {
        prompt_ids: vec![],
        completion_ids: vec![],
        behaviour_logprobs: vec![],
        reward: None,
        correct: None,
        group_id: String::new(),
        version: None,
        truncated: false,
        components: vec![],
        ..Default::default()
    }
}

/// Every float of a row as its bits, and the rest as is: equal bits mean the same row.
fn bits(e: &Experience) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {} {:?} {:?} {:?} {:?} {:?}",
        e.prompt_ids,
        e.completion_ids,
        e.behaviour_logprobs
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        e.reward.map(f64::to_bits),
        e.correct,
        e.group_id,
        e.version,
        e.truncated,
        e.components
            .iter()
            .map(|c| {
                let extra: Vec<(String, u64)> = c
                    .extra
                    .iter()
                    .map(|(k, x)| (k.clone(), x.to_bits()))
                    .collect();
                (c.name.clone(), c.raw.to_bits(), c.weighted.to_bits(), extra)
            })
            .collect::<Vec<_>>(),
        e.completion_mask,
        e.turns,
        e.turn_rewards
            .iter()
            .map(|r| r.map(f64::to_bits))
            .collect::<Vec<_>>(),
        e.env_metrics
            .iter()
            .map(|(k, x)| (k, x.to_bits()))
            .collect::<Vec<_>>(),
    )
}

fn record(g: &str) -> RolloutRecord {
    RolloutRecord {
        group_id: g.into(),
        prompt: "p\n∑".into(),
        completion: String::new(),
        reward: Some(f64::from_bits(0xfff0_0000_0000_0001)),
        correct: Some(true),
        version: None,
        finish_reason: "length".into(),
        turns: None,
        turn_rewards: None,
        metrics: Default::default(),
    }
}

#[test]
fn rows_cross_the_wire_bit_for_bit() {
    let rows = vec![
        odd_row("a", 0),
        empty_row(),
        odd_row("gruppe-ü", 1),
        odd_row("", 2),
    ];
    let bytes = wire::encode(&rows);
    let back: Vec<Experience> = wire::decode(&bytes).unwrap();
    assert_eq!(back.len(), rows.len());
    for (a, b) in rows.iter().zip(&back) {
        assert_eq!(bits(a), bits(b));
    }
    // The NaN payload and the sign of zero, spelled out.
    assert_eq!(back[0].behaviour_logprobs[0].to_bits(), NAN_A);
    assert_eq!(back[0].behaviour_logprobs[1].to_bits(), NAN_B);
    assert_eq!(back[0].behaviour_logprobs[4].to_bits(), (-0.0f32).to_bits());
    assert_eq!(back[2].reward.unwrap().to_bits(), (-0.0f64).to_bits());
    assert_eq!(back[0].components[0].raw.to_bits(), 0x7ff8_0000_dead_beef);
    assert_eq!(back[1], empty_row());
    // An empty batch is a count of 0 and nothing else.
    assert_eq!(wire::encode::<Experience>(&[]), 0u64.to_le_bytes());
    assert!(wire::decode::<Experience>(&0u64.to_le_bytes())
        .unwrap()
        .is_empty());
    // Rounds: groups (an empty one included) and rollout records.
    let groups = vec![vec![odd_row("g", 3), empty_row()], vec![]];
    let recs = vec![record("g"), record("")];
    let (g2, r2) = wire::decode_round(&wire::encode_round(&groups, &recs)).unwrap();
    assert_eq!(g2.len(), 2);
    assert!(g2[1].is_empty());
    assert_eq!(bits(&g2[0][0]), bits(&groups[0][0]));
    assert_eq!(
        r2.iter()
            .map(|r| r.reward.map(f64::to_bits))
            .collect::<Vec<_>>(),
        [Some(0xfff0_0000_0000_0001); 2]
    );
    assert_eq!(r2[0].prompt, "p\n∑");
    assert_eq!(r2[1].finish_reason, "length");
    // An episode's record: its turns and the environment's rewards (a missing one kept).
    let mut ep = record("e");
    ep.turns = Some(3);
    ep.turn_rewards = Some(vec![Some(-0.1), None, Some(1.0)]);
    ep.metrics = [("turns_used".to_string(), 2.5), ("ok".into(), -0.0)].into();
    let (_, r3) = wire::decode_round(&wire::encode_round(&[], &[ep.clone(), record("s")])).unwrap();
    assert_eq!(
        (r3[0].turns, &r3[0].turn_rewards, &r3[0].metrics),
        (ep.turns, &ep.turn_rewards, &ep.metrics)
    );
    assert_eq!(r3[0].metrics["ok"].to_bits(), (-0.0f64).to_bits());
    assert!(r3[1].metrics.is_empty());
    assert_eq!((r3[1].turns, &r3[1].turn_rewards), (None, &None));
    // Row metadata.
    let metas: Vec<RowMeta> = rows.iter().map(RowMeta::of).collect();
    let m2 = wire::decode_metas(&wire::encode_metas(&metas)).unwrap();
    assert_eq!(m2.len(), 4);
    // Sampled tokens only: row 0's mask has 0 at 2 of its 7 tokens.
    assert_eq!(m2[0].completion_tokens, 5);
    assert_eq!(m2[2].completion_tokens, 7);
    assert_eq!(m2[1], metas[1]);
    assert_eq!(m2[2].reward.unwrap().to_bits(), (-0.0f64).to_bits());
    assert!(m2[0].reward.unwrap().is_nan());
    assert!(m2[2].truncated && !m2[0].truncated);
}

#[test]
fn a_malformed_message_is_an_error_not_a_panic_or_an_allocation() {
    let bytes = wire::encode(&[odd_row("a", 1)]);
    // Every cut of a valid message fails cleanly.
    for n in 0..bytes.len() {
        assert!(
            wire::decode::<Experience>(&bytes[..n]).is_err(),
            "cut at {n}"
        );
    }
    // Bytes left over.
    let mut long = bytes.clone();
    long.push(0);
    let e = wire::decode::<Experience>(&long).unwrap_err().to_string();
    assert!(e.contains("left over"), "{e}");
    // A count of 2^60 items in a 16-byte message.
    let mut huge = (1u64 << 60).to_le_bytes().to_vec();
    huge.extend(0u64.to_le_bytes());
    let e = wire::decode::<Experience>(&huge).unwrap_err().to_string();
    assert!(e.contains("exceeds"), "{e}");
    // A bad option tag (the `correct` byte of a row: after three empty vectors and the reward).
    let mut bad = wire::encode(&[empty_row()]);
    let at = 8 + 3 * 8 + 9;
    assert_eq!(bad[at], 0);
    bad[at] = 7;
    let e = wire::decode::<Experience>(&bad).unwrap_err().to_string();
    assert!(e.contains("tag 7"), "{e}");
}

#[test]
fn a_job_of_one_process_is_the_one_process_code() {
    let mut job = Job::single();
    assert_eq!((job.rank(), job.world()), (0, 1));
    assert!(job.writer() && !job.is_parallel());
    assert_eq!(job.busy(), None);
    assert!(job.any(true).unwrap() && !job.any(false).unwrap());
    let mut xs = [1.5, -0.0, f64::NAN];
    job.max_f64(&mut xs).unwrap();
    job.sum_f64(&mut xs).unwrap();
    assert_eq!(xs[0], 1.5);
    assert_eq!(xs[1].to_bits(), (-0.0f64).to_bits());
    assert!(xs[2].is_nan());
    job.barrier().unwrap();
    assert_eq!(job.rank0_says(b"step-4".to_vec()).unwrap(), b"step-4");
    assert_eq!(job.rank0_tries("x", || Ok(7)).unwrap(), Some(7));
    let e = job
        .rank0_tries("x", || -> anyhow::Result<()> { anyhow::bail!("own error") })
        .unwrap_err();
    assert_eq!(e.to_string(), "own error");
    assert_eq!(job.my_range(5), 0..5);
    // The batch itself, in its own order, even with a group split (rank_rows would regroup it).
    let batch = vec![odd_row("b", 0), odd_row("a", 1), odd_row("b", 2)];
    let mine = job.my_rows(&batch);
    assert!(matches!(mine, std::borrow::Cow::Borrowed(_)));
    assert_eq!(
        mine.iter().map(|e| e.group_id.as_str()).collect::<Vec<_>>(),
        ["b", "a", "b"]
    );
    let view = job.gather_view(&batch).unwrap();
    assert_eq!((view.offset, view.local, view.rows.len()), (0, 3, 3));
    assert_eq!(view.rows[1].group_id, "a");
    let (g, r) = job
        .gather_round(vec![batch.clone()], vec![record("b")])
        .unwrap();
    assert_eq!(bits(&g[0][2]), bits(&batch[2]));
    assert_eq!(r.len(), 1);
    assert_eq!(job.leave_on_error(Ok(3)).unwrap(), 3);
    assert!(job.leave_on_error::<()>(Err(anyhow::anyhow!("e"))).is_err());
}

#[test]
fn ranks_gather_in_rank_order_bit_for_bit_and_learn_rank_0s_decisions() {
    let out = ThreadComm::run(3, |c| {
        let mut job = Job::over(SharedComm::new(Box::new(c)));
        let r = job.rank();
        // Rank 2 sampled nothing (fewer groups than ranks).
        let groups: Vec<Vec<Experience>> = match r {
            2 => vec![],
            _ => vec![(0..3).map(|i| odd_row(&format!("g{r}"), i)).collect()],
        };
        let (all, recs) = job
            .gather_round(groups, vec![record(&format!("g{r}"))])
            .unwrap();
        let view = job.gather_view(&all[r.min(1)]).unwrap_err().to_string();
        let decided = job.rank0_says(format!("rank {r}").into_bytes()).unwrap();
        let tried = job
            .rank0_tries("open the run directory", || -> anyhow::Result<u8> {
                anyhow::bail!("locked by another run")
            })
            .map_err(|e| e.to_string());
        let stop = job.any(r == 1).unwrap();
        let mut t = [r as f64, -(r as f64)];
        job.max_f64(&mut t).unwrap();
        (all, recs, view, decided, tried, stop, t, job.my_range(7))
    });
    let want: Vec<Experience> = (0..2)
        .flat_map(|r| (0..3).map(move |i| odd_row(&format!("g{r}"), i)))
        .collect();
    for (r, (all, recs, view, decided, tried, stop, t, range)) in out.iter().enumerate() {
        let got: Vec<String> = all.iter().flatten().map(bits).collect();
        assert_eq!(got, want.iter().map(bits).collect::<Vec<_>>());
        let ids: Vec<&str> = recs.iter().map(|r| r.group_id.as_str()).collect();
        assert_eq!(ids, ["g0", "g1", "g2"]);
        // Every rank passed rank 0's or rank 1's group: a group on two ranks is refused.
        assert!(view.contains("has rows on rank"), "{view}");
        assert_eq!(decided, b"rank 0");
        match r {
            0 => assert_eq!(tried.as_ref().unwrap_err(), "locked by another run"),
            _ => assert_eq!(
                tried.as_ref().unwrap_err(),
                "rank 0 could not open the run directory (its error says why)"
            ),
        }
        assert!(stop);
        assert_eq!(*t, [2.0, 0.0]);
        assert_eq!(range.len(), [3, 2, 2][r]);
    }
}

/// [`Job::first_in_rank_order`]: the lowest rank's `Some` on every rank (an empty message is a
/// message), `None` when no rank has one; one process passes its own through.
#[test]
fn the_first_message_in_rank_order_is_every_ranks() {
    let cases: [[Option<&str>; 3]; 3] = [
        [None, Some("b"), Some("c")],
        [Some(""), Some("b"), None],
        [None, None, None],
    ];
    for case in cases {
        let got = ThreadComm::run(3, |c| {
            let mut job = Job::over(SharedComm::new(Box::new(c)));
            let mine = case[job.rank()].map(String::from);
            job.first_in_rank_order(mine).unwrap()
        });
        let want = case.iter().find_map(|m| m.map(String::from));
        assert_eq!(got, vec![want.clone(); 3], "{case:?}");
    }
    let mut one = Job::single();
    assert_eq!(
        one.first_in_rank_order(Some("x".into()))
            .unwrap()
            .as_deref(),
        Some("x")
    );
}
