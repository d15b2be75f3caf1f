//! `ThreadComm`: every collective at world sizes 1–4 against values computed here, bit for bit;
//! mismatches, departed peers and timeouts.

use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use half::bf16;
use rlvr_dist::{Communicator, DistError, Op, ThreadComm};

fn data(rank: usize, n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = ((rank * 7919 + i * 104_729 + salt * 31) as f64 * 0.618_033_988_7).sin();
            (x * 10f64.powi((i % 7) as i32 - 3)) as f32
        })
        .collect()
}

/// The reference: rank 0's values, then each next rank's folded in, in f32.
fn reference(world: usize, n: usize, salt: usize, op: Op) -> Vec<f32> {
    let mut acc = data(0, n, salt);
    for r in 1..world {
        for (a, b) in acc.iter_mut().zip(data(r, n, salt)) {
            *a = match op {
                Op::Sum => *a + b,
                Op::Max => a.max(b),
                Op::Min => a.min(b),
            };
        }
    }
    acc
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn to_f32(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn all_reduce_every_op_and_size_is_the_rank_order_fold() {
    for world in 1..=4 {
        for (oi, op) in [Op::Sum, Op::Max, Op::Min].into_iter().enumerate() {
            let sizes: &[&[usize]] = &[&[1], &[7], &[1001], &[3, 5], &[0], &[2, 0, 3]];
            let out = ThreadComm::run(world, |mut c| {
                let ts: Vec<Tensor> = sizes
                    .iter()
                    .enumerate()
                    .map(|(si, s)| {
                        let n = s.iter().product();
                        Tensor::from_vec(data(c.rank(), n, si + 10 * oi), s.to_vec(), &Device::Cpu)
                            .unwrap()
                    })
                    .collect();
                c.all_reduce(&ts, op).unwrap();
                ts.iter().map(to_f32).collect::<Vec<_>>()
            });
            for got in &out {
                for (si, s) in sizes.iter().enumerate() {
                    let n = s.iter().product();
                    assert_eq!(
                        bits(&got[si]),
                        bits(&reference(world, n, si + 10 * oi, op)),
                        "world {world} {op:?} {s:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn bf16_and_f64_reductions() {
    let n = 300;
    for world in [2, 3] {
        let out = ThreadComm::run(world, |mut c| {
            let b = Tensor::from_vec(data(c.rank(), n, 1), n, &Device::Cpu)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap();
            let d = Tensor::from_vec(data(c.rank(), n, 2), n, &Device::Cpu)
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap();
            c.all_reduce(&[b.clone(), d.clone()], Op::Sum).unwrap();
            assert_eq!((b.dtype(), d.dtype()), (DType::BF16, DType::F64));
            (b.to_vec1::<bf16>().unwrap(), d.to_vec1::<f64>().unwrap())
        });
        // bf16: each rank's bf16 values summed in f32 in rank order, rounded once.
        let mut acc = vec![0f32; n];
        let mut acc64 = vec![0f64; n];
        for r in 0..world {
            for i in 0..n {
                let x = bf16::from_f32(data(r, n, 1)[i]).to_f32();
                acc[i] = if r == 0 { x } else { acc[i] + x };
                let y = f64::from(data(r, n, 2)[i]);
                acc64[i] = if r == 0 { y } else { acc64[i] + y };
            }
        }
        let want: Vec<bf16> = acc.iter().map(|x| bf16::from_f32(*x)).collect();
        for (b, d) in &out {
            assert_eq!(b, &want);
            assert_eq!(d, &acc64);
        }
    }
}

#[test]
fn broadcast_from_every_root_writes_in_place_and_into_views() {
    let world = 3;
    for root in 0..world {
        let out = ThreadComm::run(world, |mut c| {
            let r = c.rank();
            let f = Tensor::from_vec(data(r, 5, 3), 5, &Device::Cpu).unwrap();
            let u = Tensor::from_vec(vec![r as u32; 4], (2, 2), &Device::Cpu).unwrap();
            let base = Tensor::from_vec(data(r, 10, 4), 10, &Device::Cpu).unwrap();
            let view = base.narrow(0, 2, 3).unwrap();
            c.broadcast(&[f.clone(), u.clone(), view], root).unwrap();
            (
                to_f32(&f),
                u.flatten_all().unwrap().to_vec1::<u32>().unwrap(),
                to_f32(&base),
                r,
            )
        });
        for (f, u, base, r) in out {
            assert_eq!(bits(&f), bits(&data(root, 5, 3)));
            assert_eq!(u, vec![root as u32; 4]);
            let mut want = data(r, 10, 4);
            want[2..5].copy_from_slice(&data(root, 10, 4)[2..5]);
            assert_eq!(bits(&base), bits(&want));
        }
    }
}

#[test]
fn all_gather_uneven_and_reduce_scatter() {
    for world in 1..=4 {
        let out = ThreadComm::run(world, |mut c| {
            let r = c.rank();
            let shard = Tensor::from_vec(data(r, r * 2, 5), (r, 2), &Device::Cpu).unwrap();
            let g = c.all_gather(&shard).unwrap();
            let flat =
                Tensor::from_vec(data(r, world * 6, 6), (world * 3, 2), &Device::Cpu).unwrap();
            let s = c.reduce_scatter(&flat, Op::Sum).unwrap();
            let m = c
                .reduce_scatter(&flat.to_dtype(DType::BF16).unwrap(), Op::Max)
                .unwrap();
            (
                g.dims().to_vec(),
                to_f32(&g),
                s.dims().to_vec(),
                to_f32(&s),
                m.dtype(),
                to_f32(&m),
                r,
            )
        });
        let rows: usize = (0..world).sum();
        let gathered: Vec<f32> = (0..world).flat_map(|r| data(r, r * 2, 5)).collect();
        let sum = reference(world, world * 6, 6, Op::Sum);
        for (gd, g, sd, s, mdt, m, r) in out {
            assert_eq!(gd, [rows, 2]);
            assert_eq!(bits(&g), bits(&gathered));
            assert_eq!(sd, [3, 2]);
            assert_eq!(bits(&s), bits(&sum[r * 6..(r + 1) * 6]));
            assert_eq!(mdt, DType::BF16);
            let mut want = vec![f32::NEG_INFINITY; 6];
            for q in 0..world {
                for (i, w) in want.iter_mut().enumerate() {
                    *w = w.max(bf16::from_f32(data(q, world * 6, 6)[r * 6 + i]).to_f32());
                }
            }
            assert_eq!(bits(&m), bits(&want));
        }
    }
}

#[test]
fn host_collectives() {
    let out = ThreadComm::run(3, |mut c| {
        let r = c.rank();
        let mut xs = [r as f64, r as f64, r as f64];
        c.all_reduce_f64(&mut xs[..1], Op::Sum).unwrap();
        c.all_reduce_f64(&mut xs[1..2], Op::Max).unwrap();
        c.all_reduce_f64(&mut xs[2..], Op::Min).unwrap();
        let g = c.all_gather_bytes(&vec![r as u8; r]).unwrap();
        let mut b = if r == 1 {
            b"root one".to_vec()
        } else {
            Vec::new()
        };
        c.broadcast_bytes(&mut b, 1).unwrap();
        c.barrier().unwrap();
        let any = c.any(r == 2).unwrap();
        (xs, g, b, any)
    });
    for (xs, g, b, any) in out {
        assert_eq!(xs, [3.0, 2.0, 0.0]);
        assert_eq!(g, vec![vec![], vec![1], vec![2, 2]]);
        assert_eq!(b, b"root one");
        assert!(any);
    }
}

#[test]
fn two_ranks_equal_one_addition() {
    // The bitwise property the MPI test relies on: a two-rank sum is x0 + x1 (and x1 + x0).
    let out = ThreadComm::run(2, |mut c| {
        let t = Tensor::from_vec(data(c.rank(), 4096, 9), 4096, &Device::Cpu).unwrap();
        c.all_reduce(std::slice::from_ref(&t), Op::Sum).unwrap();
        to_f32(&t)
    });
    let want: Vec<f32> = data(1, 4096, 9)
        .iter()
        .zip(data(0, 4096, 9))
        .map(|(a, b)| a + b)
        .collect();
    assert_eq!(bits(&out[0]), bits(&want));
    assert_eq!(bits(&out[1]), bits(&want));
}

#[test]
fn a_layout_mismatch_is_an_error_on_every_rank() {
    let out = ThreadComm::run(2, |mut c| {
        let t = Tensor::zeros(3 + c.rank(), DType::F32, &Device::Cpu).unwrap();
        c.all_reduce(&[t], Op::Sum).unwrap_err().to_string()
    });
    for e in &out {
        assert!(e.starts_with("all_reduce: ranks disagree: rank 0: all_reduce #0 Sum F32[3]; rank 1: all_reduce #0 Sum F32[4]"), "{e}");
    }
    // Different collectives.
    let out = ThreadComm::run(2, |mut c| {
        if c.rank() == 0 {
            c.barrier().unwrap_err().to_string()
        } else {
            c.all_gather_bytes(b"x").unwrap_err().to_string()
        }
    });
    assert!(
        out[0].contains("rank 0: barrier #0") && out[0].contains("rank 1: all_gather_bytes #0"),
        "{}",
        out[0]
    );
}

#[test]
fn a_peer_that_leaves_fails_the_others_at_once() {
    let t0 = Instant::now();
    let out = ThreadComm::run(3, |mut c| {
        c.barrier().unwrap();
        if c.rank() == 2 {
            return None; // drops its ThreadComm: the thread "exits early"
        }
        Some(c.all_reduce_f64(&mut [1.0], Op::Sum).unwrap_err())
    });
    assert!(t0.elapsed() < Duration::from_secs(10));
    for e in out.into_iter().take(2) {
        // The rank that noticed first gets PeerGone; one arriving after it, the same failure
        // wrapped as Broken.
        let e = e.unwrap();
        assert!(
            matches!(
                e,
                DistError::PeerGone {
                    rank: 2,
                    seq: 1,
                    ..
                } | DistError::Broken(_)
            ),
            "{e}"
        );
        assert!(
            e.to_string().ends_with(
                "all_reduce_f64 (collective #1): rank 2 has left the group, so the collective cannot complete"
            ),
            "{e}"
        );
    }
}

#[test]
fn a_peer_that_hangs_times_the_others_out_naming_it() {
    let timeout = Duration::from_millis(300);
    let out = ThreadComm::run_with_timeout(3, Some(timeout), |mut c| {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(1500));
            // Arriving late finds the group broken.
            let e = c.barrier().unwrap_err();
            return (e.to_string(), Duration::ZERO);
        }
        let t0 = Instant::now();
        let e = c.barrier().unwrap_err();
        (e.to_string(), t0.elapsed())
    });
    for (r, (e, took)) in out.iter().enumerate() {
        if r == 1 {
            assert!(
                e.starts_with("communicator unusable after an earlier failure"),
                "{e}"
            );
            continue;
        }
        assert!(e.contains("ranks that had not reached it: [1]"), "{e}");
        assert!(
            *took >= timeout / 2 && *took < Duration::from_secs(5),
            "{took:?}"
        );
    }
}
