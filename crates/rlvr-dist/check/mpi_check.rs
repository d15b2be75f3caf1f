//! `rlvr-dist-check --case NAME`: one rank of the MPI checks, run under
//! `mpirun --allow-run-as-root --oversubscribe -np N` by `tests/mpi.rs`.
//!
//! Cases:
//! - `collectives`: every collective over f32, f64, bf16, f16 and integer tensors, uneven
//!   gathers and host values, checked against values every rank computes on its own from the
//!   same generator; run twice, the second time with at most 7 elements per MPI call so that
//!   every split path runs. At two ranks sums must equal the in-process computation bit for bit
//!   (and a two-thread [`ThreadComm`] run of the same calls); at more, within 1e-6 relative, and
//!   identical on every rank. Then [`DistReduce`] with a NaN on the last rank only: every rank
//!   must see it and skip.
//! - `mismatch`: with the layout checks on, ranks pass different shapes; every rank must get a
//!   `Mismatch` error rather than hang.
//! - `exit-early`: the last rank exits with code 3 before a collective the others wait in.
//! - `hang`: the last rank sleeps instead of joining; the others must time out and abort.
//! - `finalize-early`: the last rank finalises MPI and returns 0 while the others wait.
//! - `panic`: the last rank panics while the others wait.
//! - `init`: [`rlvr_dist::init`] from the launcher's variables: MPI under mpirun, [`rlvr_dist::LocalComm`]
//!   for a world of 1 (started without mpirun).
//!
//! - `bandwidth`: not a check: times the in-place f32 SUM all-reduce of 4 KiB to 256 MiB
//!   (median of repeated calls after a warm-up) and prints one JSON line per size from rank 0:
//!   seconds per call, algorithm bandwidth (bytes / s) and bus bandwidth (× 2(W−1)/W, as
//!   nccl-tests reports it). `bench/data_parallel.sh` runs it.
//!
//! Prints `rank R: ok (…)` and exits 0 when its checks pass; panics otherwise.

#![forbid(unsafe_code)]

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use rlvr_dist::{Communicator, DistReduce, MpiComm, Op, ThreadComm};

/// Rank r's element i: mixed signs and magnitudes, so that sums round.
fn value(rank: usize, i: usize, salt: usize) -> f64 {
    let x = ((rank * 7919 + i * 104_729 + salt * 31) as f64 * 0.618_033_988_7).sin();
    x * 10f64.powi((i % 7) as i32 - 3)
}

fn data_f32(rank: usize, n: usize, salt: usize) -> Vec<f32> {
    (0..n).map(|i| value(rank, i, salt) as f32).collect()
}

const SIZES: &[&[usize]] = &[&[1], &[7], &[1000], &[3, 5], &[0], &[2, 0, 3]];

fn fold(acc: &mut [f64], x: &[f64], op: Op) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a = match op {
            Op::Sum => *a + *b,
            Op::Max => a.max(*b),
            Op::Min => a.min(*b),
        }
    }
}

struct Checker {
    rank: usize,
    checks: usize,
}

impl Checker {
    fn same_bits_f32(&mut self, what: &str, got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "rank {}: {what}[{i}]: {g} vs {w}",
                self.rank
            );
        }
        self.checks += 1;
    }

    fn close(&mut self, what: &str, got: &[f64], want: &[f64], rel: f64) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        let scale = want.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= rel * scale,
                "rank {}: {what}[{i}]: {g} vs {w}",
                self.rank
            );
        }
        self.checks += 1;
    }

    fn exact<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, got: T, want: T) {
        assert_eq!(got, want, "rank {}: {what}", self.rank);
        self.checks += 1;
    }
}

/// A digest of a result, all-gathered so that every rank can check all got the same bits.
fn digest(bytes: &[u8]) -> Vec<u8> {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    h.to_le_bytes().to_vec()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The all-reduce of f32 tensors as the in-process reference computes it: each rank's values in
/// f32, added in rank order (what ThreadComm does, and what any engine does at two ranks).
fn reference_f32(world: usize, n: usize, salt: usize, op: Op) -> Vec<f32> {
    let mut acc = data_f32(0, n, salt);
    for r in 1..world {
        for (a, b) in acc.iter_mut().zip(data_f32(r, n, salt)) {
            *a = match op {
                Op::Sum => *a + b,
                Op::Max => a.max(b),
                Op::Min => a.min(b),
            }
        }
    }
    acc
}

fn run_collectives(c: &mut dyn Communicator, k: &mut Checker, pass: usize) -> Vec<Vec<f32>> {
    let (rank, world) = (c.rank(), c.world_size());
    let dev = Device::Cpu;
    let mut sums = Vec::new();
    // all_reduce, f32: several tensors in one call, every op.
    for (oi, op) in [Op::Sum, Op::Max, Op::Min].into_iter().enumerate() {
        let ts: Vec<Tensor> = SIZES
            .iter()
            .enumerate()
            .map(|(si, s)| {
                let n: usize = s.iter().product();
                Tensor::from_vec(data_f32(rank, n, si + 10 * oi), s.to_vec(), &dev).unwrap()
            })
            .collect();
        c.all_reduce(&ts, op).unwrap();
        for (si, (t, s)) in ts.iter().zip(SIZES).enumerate() {
            let n: usize = s.iter().product();
            assert_eq!(t.dims(), *s);
            let got: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
            let want = reference_f32(world, n, si + 10 * oi, op);
            if op != Op::Sum || world == 2 {
                k.same_bits_f32(
                    &format!("pass {pass} all_reduce f32 {op:?} {s:?}"),
                    &got,
                    &want,
                );
            } else {
                let g: Vec<f64> = got.iter().map(|x| f64::from(*x)).collect();
                let w: Vec<f64> = want.iter().map(|x| f64::from(*x)).collect();
                k.close(
                    &format!("pass {pass} all_reduce f32 sum {s:?}"),
                    &g,
                    &w,
                    1e-6,
                );
            }
            if op == Op::Sum {
                sums.push(got);
            }
        }
    }
    // All ranks got identical bits.
    let d = digest(&sums.iter().flat_map(|v| f32_bytes(v)).collect::<Vec<_>>());
    let all = c.all_gather_bytes(&d).unwrap();
    k.exact(
        "identical sums on every rank",
        all.iter().all(|x| *x == d),
        true,
    );

    // all_reduce, f64, bf16, f16 (reduced in f32 and rounded once).
    let n = 777;
    let t64 = Tensor::from_vec(
        (0..n).map(|i| value(rank, i, 50)).collect::<Vec<f64>>(),
        n,
        &dev,
    )
    .unwrap();
    c.all_reduce(std::slice::from_ref(&t64), Op::Sum).unwrap();
    let mut want = vec![0f64; n];
    for r in 0..world {
        fold(
            &mut want,
            &(0..n).map(|i| value(r, i, 50)).collect::<Vec<_>>(),
            Op::Sum,
        );
    }
    k.close(
        "all_reduce f64 sum",
        &t64.to_vec1::<f64>().unwrap(),
        &want,
        1e-12,
    );
    for dt in [DType::BF16, DType::F16] {
        let mine = Tensor::from_vec(data_f32(rank, n, 60), n, &dev)
            .unwrap()
            .to_dtype(dt)
            .unwrap();
        c.all_reduce(std::slice::from_ref(&mine), Op::Sum).unwrap();
        // Independently: each rank's values rounded to dt, summed in f32, rounded once.
        let mut acc = vec![0f32; n];
        for r in 0..world {
            let x: Vec<f32> = Tensor::from_vec(data_f32(r, n, 60), n, &dev)
                .unwrap()
                .to_dtype(dt)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec1()
                .unwrap();
            if r == 0 {
                acc = x;
            } else {
                acc.iter_mut().zip(x).for_each(|(a, b)| *a += b);
            }
        }
        let want: Vec<f32> = acc
            .iter()
            .map(|x| match dt {
                DType::BF16 => bf16::from_f32(*x).to_f32(),
                _ => f16::from_f32(*x).to_f32(),
            })
            .collect();
        let got: Vec<f32> = mine.to_dtype(DType::F32).unwrap().to_vec1().unwrap();
        if world == 2 {
            k.same_bits_f32(&format!("all_reduce {dt:?} sum"), &got, &want);
        } else {
            let g: Vec<f64> = got.iter().map(|x| f64::from(*x)).collect();
            let w: Vec<f64> = want.iter().map(|x| f64::from(*x)).collect();
            k.close(&format!("all_reduce {dt:?} sum"), &g, &w, 1e-2);
        }
        // Max of a rounded value is exact at any world size.
        let mine = Tensor::from_vec(data_f32(rank, n, 61), n, &dev)
            .unwrap()
            .to_dtype(dt)
            .unwrap();
        c.all_reduce(std::slice::from_ref(&mine), Op::Max).unwrap();
        let mut want = vec![f32::NEG_INFINITY; n];
        for r in 0..world {
            let x: Vec<f32> = Tensor::from_vec(data_f32(r, n, 61), n, &dev)
                .unwrap()
                .to_dtype(dt)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec1()
                .unwrap();
            want.iter_mut().zip(x).for_each(|(a, b)| *a = a.max(b));
        }
        let got: Vec<f32> = mine.to_dtype(DType::F32).unwrap().to_vec1().unwrap();
        k.same_bits_f32(&format!("all_reduce {dt:?} max"), &got, &want);
    }

    // broadcast from every root, every copyable dtype, in place; views of a larger tensor too.
    for root in 0..world {
        let f = Tensor::from_vec(data_f32(rank, 13, 70), 13, &dev).unwrap();
        let b = f.to_dtype(DType::BF16).unwrap();
        let u = Tensor::from_vec(
            (0..9).map(|i| (rank * 100 + i) as u32).collect::<Vec<_>>(),
            (3, 3),
            &dev,
        )
        .unwrap();
        let l = Tensor::from_vec(
            (0..4)
                .map(|i| -((rank * 10 + i) as i64))
                .collect::<Vec<_>>(),
            4,
            &dev,
        )
        .unwrap();
        let base = Tensor::from_vec(data_f32(rank, 20, 71), 20, &dev).unwrap();
        let view = base.narrow(0, 5, 10).unwrap();
        c.broadcast(&[f.clone(), b.clone(), u.clone(), l.clone(), view], root)
            .unwrap();
        k.same_bits_f32(
            "broadcast f32",
            &f.to_vec1::<f32>().unwrap(),
            &data_f32(root, 13, 70),
        );
        let wb: Vec<f32> = Tensor::from_vec(data_f32(root, 13, 70), 13, &dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec1()
            .unwrap();
        k.same_bits_f32(
            "broadcast bf16",
            &b.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap(),
            &wb,
        );
        k.exact(
            "broadcast u32",
            u.flatten_all().unwrap().to_vec1::<u32>().unwrap(),
            (0..9).map(|i| (root * 100 + i) as u32).collect(),
        );
        k.exact(
            "broadcast i64",
            l.to_vec1::<i64>().unwrap(),
            (0..4).map(|i| -((root * 10 + i) as i64)).collect(),
        );
        let mut wv = data_f32(rank, 20, 71);
        wv[5..15].copy_from_slice(&data_f32(root, 20, 71)[5..15]);
        k.same_bits_f32(
            "broadcast into a view",
            &base.to_vec1::<f32>().unwrap(),
            &wv,
        );
    }

    // all_gather with uneven leading sizes (rank r has r+1 rows), f32, bf16, u32.
    let shard = Tensor::from_vec(data_f32(rank, (rank + 1) * 3, 80), (rank + 1, 3), &dev).unwrap();
    let g = c.all_gather(&shard).unwrap();
    let total: usize = (1..=world).sum();
    k.exact("all_gather dims", g.dims().to_vec(), vec![total, 3]);
    let want: Vec<f32> = (0..world)
        .flat_map(|r| data_f32(r, (r + 1) * 3, 80))
        .collect();
    k.same_bits_f32(
        "all_gather f32",
        &g.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        &want,
    );
    let gb = c.all_gather(&shard.to_dtype(DType::BF16).unwrap()).unwrap();
    let wb: Vec<f32> = Tensor::from_vec(want.clone(), want.len(), &dev)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap();
    k.same_bits_f32(
        "all_gather bf16",
        &gb.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap(),
        &wb,
    );
    let gu = c
        .all_gather(&Tensor::from_vec(vec![rank as u32; rank], rank, &dev).unwrap())
        .unwrap();
    k.exact(
        "all_gather u32 (rank 0 empty)",
        gu.to_vec1::<u32>().unwrap(),
        (0..world).flat_map(|r| vec![r as u32; r]).collect(),
    );

    // reduce_scatter: [W·4, 2] → this rank's [4, 2].
    for op in [Op::Sum, Op::Max] {
        let n = world * 8;
        let flat = Tensor::from_vec(data_f32(rank, n, 90), (world * 4, 2), &dev).unwrap();
        let before = flat.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mine = c.reduce_scatter(&flat, op).unwrap();
        k.exact("reduce_scatter dims", mine.dims().to_vec(), vec![4, 2]);
        k.same_bits_f32(
            "reduce_scatter leaves its input",
            &flat.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            &before,
        );
        let want = reference_f32(world, n, 90, op)[rank * 8..(rank + 1) * 8].to_vec();
        let got = mine.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        if op == Op::Max || world == 2 {
            k.same_bits_f32(&format!("reduce_scatter {op:?}"), &got, &want);
        } else {
            let g: Vec<f64> = got.iter().map(|x| f64::from(*x)).collect();
            let w: Vec<f64> = want.iter().map(|x| f64::from(*x)).collect();
            k.close("reduce_scatter sum", &g, &w, 1e-6);
        }
    }

    // Host values: counts (exact), maxima, minima; bytes of uneven lengths; a broadcast of bytes.
    let mut xs = [rank as f64 + 1.0, -(rank as f64), 0.5 * rank as f64];
    c.all_reduce_f64(&mut xs[..1], Op::Sum).unwrap();
    c.all_reduce_f64(&mut xs[1..2], Op::Min).unwrap();
    c.all_reduce_f64(&mut xs[2..], Op::Max).unwrap();
    let w = world as f64;
    k.exact(
        "all_reduce_f64",
        xs,
        [w * (w + 1.0) / 2.0, -(w - 1.0), 0.5 * (w - 1.0)],
    );
    let mine: Vec<u8> = vec![rank as u8; rank * 3 + 1];
    let all = c.all_gather_bytes(&mine).unwrap();
    k.exact(
        "all_gather_bytes",
        all,
        (0..world)
            .map(|r| vec![r as u8; r * 3 + 1])
            .collect::<Vec<_>>(),
    );
    let mut buf = if rank == world - 1 {
        b"from the last rank".to_vec()
    } else {
        vec![9; rank]
    };
    c.broadcast_bytes(&mut buf, world - 1).unwrap();
    k.exact("broadcast_bytes", buf, b"from the last rank".to_vec());
    c.barrier().unwrap();
    k.exact("any (only rank 0)", c.any(rank == 0).unwrap(), true);
    k.exact("any (none)", c.any(false).unwrap(), false);
    // Errors are local and leave the communicator usable.
    assert!(c.broadcast(&[], world).is_err());
    assert!(c
        .reduce_scatter(
            &Tensor::zeros(world + 1, DType::F32, &dev).unwrap(),
            Op::Sum
        )
        .is_err());
    c.barrier().unwrap();
    sums
}

/// The gradient reducer with a NaN on the last rank only: every rank must skip.
fn run_reduce(c: Box<dyn Communicator>, k: &mut Checker) {
    let (rank, world) = (c.rank(), c.world_size());
    let dev = Device::Cpu;
    let shapes: [&[usize]; 4] = [&[4, 3], &[5], &[1], &[2, 2]];
    let params: Vec<Tensor> = shapes
        .iter()
        .map(|s| Tensor::zeros(s.to_vec(), DType::F32, &dev).unwrap())
        .collect();
    // Buckets of at most 8 elements: [12] [5 1] [4 + flag].
    let mut red = DistReduce::with_bucket_elems(c, &params, 8).unwrap();
    let grad = |r: usize, i: usize| -> Option<Tensor> {
        let n: usize = shapes[i].iter().product();
        (r + i)
            .is_multiple_of(2)
            .then(|| Tensor::from_vec(data_f32(r, n, 100 + i), shapes[i].to_vec(), &dev).unwrap())
    };
    let mut g: Vec<Option<Tensor>> = (0..shapes.len()).map(|i| grad(rank, i)).collect();
    let mut finite = rank != world - 1;
    red.reduce(&mut g, &mut finite).unwrap();
    k.exact("NaN on the last rank is seen by all", finite, false);
    k.exact("non-finite rank count", red.non_finite_ranks(), 1);
    for (i, s) in shapes.iter().enumerate() {
        let n: usize = s.iter().product();
        let mut acc: Option<Vec<f32>> = None;
        for r in 0..world {
            let x = grad(r, i).map_or(vec![0.0; n], |t| {
                t.flatten_all().unwrap().to_vec1().unwrap()
            });
            match &mut acc {
                None => acc = Some(x),
                Some(a) => a.iter_mut().zip(x).for_each(|(a, b)| *a += b),
            }
        }
        let t = g[i]
            .as_ref()
            .expect("every entry is Some after a reduction");
        k.exact("gradient shape", t.dims().to_vec(), s.to_vec());
        let got: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        if world == 2 {
            k.same_bits_f32("reduced gradient", &got, acc.as_ref().unwrap());
        } else {
            let gg: Vec<f64> = got.iter().map(|x| f64::from(*x)).collect();
            let w: Vec<f64> = acc.unwrap().iter().map(|x| f64::from(*x)).collect();
            k.close("reduced gradient", &gg, &w, 1e-6);
        }
    }
    // And an all-finite update stays finite.
    let mut g: Vec<Option<Tensor>> = vec![None; shapes.len()];
    let mut finite = true;
    red.reduce(&mut g, &mut finite).unwrap();
    k.exact("all finite", (finite, red.non_finite_ranks()), (true, 0));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let case = args
        .iter()
        .position(|a| a == "--case")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
        .unwrap_or("collectives");
    let t0 = Instant::now();
    let launch = rlvr_dist::env::from_process_env().expect("launcher environment");
    if case == "init" {
        let mut comm = rlvr_dist::init(&launch).expect("init");
        assert_eq!(
            (comm.rank(), comm.world_size()),
            (launch.rank, launch.world_size)
        );
        let t = Tensor::ones(3, DType::F32, &Device::Cpu).unwrap();
        comm.all_reduce(std::slice::from_ref(&t), Op::Sum).unwrap();
        let w = launch.world_size as f32;
        assert_eq!(t.to_vec1::<f32>().unwrap(), [w, w, w]);
        println!("rank {}: ok (init: {launch})", launch.rank);
        return;
    }
    let comm = MpiComm::init().expect("MPI init");
    let (rank, world) = (comm.rank(), comm.world_size());
    assert_eq!(
        (launch.rank, launch.world_size),
        (rank, world),
        "env resolution agrees with MPI"
    );
    let mut k = Checker { rank, checks: 0 };
    match case {
        "collectives" => {
            let mut comm = comm;
            let sums = run_collectives(&mut comm, &mut k, 0);
            let mut comm = comm.with_max_count(7);
            let split = run_collectives(&mut comm, &mut k, 1);
            if world == 2 {
                for (a, b) in sums.iter().zip(&split) {
                    k.same_bits_f32("split calls give the same sums", a, b);
                }
                // The same calls on two threads of this process: bitwise the same sums.
                let threaded = ThreadComm::run(2, |mut c| {
                    let mut kk = Checker {
                        rank: c.rank(),
                        checks: 0,
                    };
                    run_collectives(&mut c, &mut kk, 2)
                });
                let mine = &threaded[rank];
                for (a, b) in sums.iter().zip(mine) {
                    k.same_bits_f32("MPI sum == ThreadComm sum", a, b);
                }
            }
            run_reduce(Box::new(comm), &mut k);
            println!(
                "rank {rank}: ok ({} checks, world {world}, {}, {:.2} s)",
                k.checks,
                launch,
                t0.elapsed().as_secs_f64()
            );
        }
        "mismatch" => {
            let mut comm = comm.with_checks(true);
            let t = Tensor::zeros(3 + rank, DType::F32, &Device::Cpu).unwrap();
            let e = comm.all_reduce(&[t], Op::Sum).unwrap_err().to_string();
            assert!(e.contains("ranks disagree"), "{e}");
            comm.barrier().unwrap();
            println!("rank {rank}: ok (mismatch detected: {e})");
        }
        "exit-early" | "hang" | "finalize-early" | "panic" => {
            let mut comm = comm;
            comm.barrier().unwrap();
            if rank == world - 1 {
                eprintln!("rank {rank}: leaving ({case})");
                match case {
                    "exit-early" => std::process::exit(3),
                    "hang" => std::thread::sleep(std::time::Duration::from_secs(3600)),
                    "panic" => panic!("rank {rank}: a deliberate panic"),
                    _ => {
                        drop(comm);
                        return;
                    }
                }
            }
            let t = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
            comm.all_reduce(&[t], Op::Sum).unwrap();
            panic!("rank {rank}: the all_reduce completed without the last rank");
        }
        "bandwidth" => bandwidth(comm),
        other => panic!("unknown case {other:?}"),
    }
}

/// The `bandwidth` case (module docs).
fn bandwidth(mut comm: MpiComm) {
    let (rank, world) = (comm.rank(), comm.world_size());
    for log2 in (10..=26).step_by(2) {
        let n = 1usize << log2; // f32 elements: 4 KiB .. 256 MiB
        let t = Tensor::ones(n, DType::F32, &Device::Cpu).unwrap();
        let reps = (((1usize << 28) / (n * 4)).clamp(3, 200)) + 1;
        let mut secs = Vec::with_capacity(reps);
        for _ in 0..reps {
            comm.barrier().unwrap();
            let t0 = Instant::now();
            comm.all_reduce(std::slice::from_ref(&t), Op::Sum).unwrap();
            secs.push(t0.elapsed().as_secs_f64());
        }
        secs.remove(0); // warm-up
        secs.sort_by(f64::total_cmp);
        let med = secs[secs.len() / 2];
        let bytes = (n * 4) as f64;
        let alg = bytes / med;
        let bus = alg * 2.0 * (world - 1) as f64 / world as f64;
        if rank == 0 {
            println!(
                "{{\"world\": {world}, \"bytes\": {}, \"calls\": {}, \"median_s\": {med:.6e}, \"algbw_gb_s\": {:.3}, \"busbw_gb_s\": {:.3}}}",
                n * 4,
                secs.len(),
                alg / 1e9,
                bus / 1e9
            );
        }
    }
}
