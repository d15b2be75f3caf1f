//! Rank, world size and local rank from the launcher's environment, and the device rule.
//!
//! [`resolve`] is a pure function of an environment map (tests pass literal maps;
//! [`from_process_env`] passes the process's). It reads the first group of variables present, in
//! this order:
//!
//! | order | launcher | rank | world size | local rank | local world size |
//! |---|---|---|---|---|---|
//! | 1 | rlvr's own override | `RLVR_RANK` | `RLVR_WORLD_SIZE` | `RLVR_LOCAL_RANK` | `RLVR_LOCAL_WORLD_SIZE` |
//! | 2a | OpenMPI `mpirun` | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `OMPI_COMM_WORLD_LOCAL_SIZE` |
//! | 2b | MPICH / Intel MPI (Hydra, PMI) | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` | `MPI_LOCALNRANKS` |
//! | 2c | PMIx (`srun --mpi=pmix`) | `PMIX_RANK` | `SLURM_NTASKS` | `SLURM_LOCALID` | – |
//! | 3 | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `LOCAL_WORLD_SIZE` |
//! | 4 | SLURM `srun` | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` | – |
//!
//! With none of them the world size is 1 (rank 0, local rank 0). A group is present when its rank
//! or world-size variable is set; local variables alone do not make one.
//!
//! Errors rather than guesses:
//! - a value that is not a plain decimal integer (`"two"`, `"-1"`, `""`, `"1.5"`);
//! - half a group (a rank without a world size, or the reverse);
//! - a world size of 0, a rank or local rank not below its size, a local world larger than the
//!   world;
//! - MPI variables that disagree with each other (`OMPI_COMM_WORLD_RANK` against `PMI_RANK`,
//!   `PMIX_RANK` against `SLURM_PROCID`);
//! - `RLVR_RANK` / `RLVR_WORLD_SIZE` that disagree with the launcher group that is also present (a
//!   wrong override would hang every collective).
//!
//! Lower-priority groups that disagree with the chosen one are ignored, not errors: `mpirun`
//! inside an `salloc` allocation sees the allocation's `SLURM_NTASKS`, and `srun` starting
//! torchrun sets `SLURM_PROCID` per node, not per worker.

use std::collections::BTreeMap;
use std::fmt;

/// Which launcher's variables gave the rank and world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// No launcher variables: one process.
    Default,
    /// `RLVR_RANK` / `RLVR_WORLD_SIZE`.
    Rlvr,
    /// OpenMPI's `OMPI_COMM_WORLD_*`.
    OpenMpi,
    /// PMI's `PMI_RANK` / `PMI_SIZE` (MPICH's and Intel MPI's Hydra).
    Pmi,
    /// PMIx's `PMIX_RANK`, with SLURM's world size and local id.
    Pmix,
    /// torchrun's `RANK` / `WORLD_SIZE`.
    Torchrun,
    /// SLURM's `SLURM_PROCID` / `SLURM_NTASKS`.
    Slurm,
}

impl Source {
    /// The variable the rank came from (`"-"` for [`Source::Default`]).
    pub fn rank_var(self) -> &'static str {
        group(self).map_or("-", |g| g.rank)
    }

    /// The variable the world size came from (`"-"` for [`Source::Default`]).
    pub fn world_var(self) -> &'static str {
        group(self).map_or("-", |g| g.world)
    }
}

/// This process's place in the job, as the launcher's environment states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of processes in the job (≥ 1).
    pub world_size: usize,
    /// Rank among the processes on this node, when the launcher says (always `Some(0)` for a
    /// world of 1). Picks the GPU in [`device_for`].
    pub local_rank: Option<usize>,
    /// Number of processes on this node, when the launcher says.
    pub local_world_size: Option<usize>,
    /// Where the rank and world size came from.
    pub source: Source,
}

impl Launch {
    /// One process: rank 0 of 1, local rank 0.
    pub fn single() -> Self {
        Launch {
            rank: 0,
            world_size: 1,
            local_rank: Some(0),
            local_world_size: Some(1),
            source: Source::Default,
        }
    }
}

impl fmt::Display for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} of {}", self.rank, self.world_size)?;
        if let Some(l) = self.local_rank {
            write!(f, ", local rank {l}")?;
        }
        if self.source != Source::Default {
            write!(f, " (from {})", self.source.rank_var())?;
        }
        Ok(())
    }
}

/// Why the environment could not be turned into a [`Launch`] or a device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A variable is set to something that is not a non-negative decimal integer.
    #[error("{var}={value:?} is not a non-negative integer")]
    NotANumber {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// One variable of a pair is set and the other is not.
    #[error("{present} is set but {missing} is not: a launcher sets both, so set or unset them together")]
    Missing {
        /// The variable that is set.
        present: &'static str,
        /// The one that should be set with it.
        missing: &'static str,
    },
    /// A world size (or local world size) of 0.
    #[error("{var}=0: a world has at least one process")]
    ZeroSize {
        /// The variable.
        var: &'static str,
    },
    /// A rank not below its size.
    #[error("{rank_var}={rank} is not below {size_var}={size}")]
    OutOfRange {
        /// The rank variable.
        rank_var: &'static str,
        /// Its value.
        rank: usize,
        /// The size variable.
        size_var: &'static str,
        /// Its value.
        size: usize,
    },
    /// Two variables that must agree do not.
    #[error("{a}={a_value} contradicts {b}={b_value}: {hint}")]
    Contradiction {
        /// The first variable.
        a: &'static str,
        /// Its value.
        a_value: usize,
        /// The second variable.
        b: &'static str,
        /// Its value.
        b_value: usize,
        /// What to do about it.
        hint: &'static str,
    },
    /// `PMIX_RANK` is set but nothing states the world size.
    #[error(
        "PMIX_RANK is set but no variable gives the world size (PMIx puts none in the \
         environment; srun adds SLURM_NTASKS): set RLVR_WORLD_SIZE"
    )]
    NoWorldSize,
    /// `cuda` without an index on several ranks, and the launcher gives no local rank.
    #[error(
        "device \"cuda\" on rank {rank} of {world_size}: the launcher ({launcher:?}) gives no \
         local rank to pick the GPU with; set RLVR_LOCAL_RANK, or give the device as cuda:N"
    )]
    NoLocalRank {
        /// This rank.
        rank: usize,
        /// The world size.
        world_size: usize,
        /// The launcher.
        launcher: Source,
    },
    /// `cuda` and `CUDA_VISIBLE_DEVICES` lists no device.
    #[error("device \"cuda\" but CUDA_VISIBLE_DEVICES={0:?} lists no GPU")]
    NoVisibleGpu(String),
    /// The local rank has no GPU of its own among those visible.
    #[error(
        "device \"cuda\" on local rank {local_rank}, but CUDA_VISIBLE_DEVICES={visible:?} lists \
         only {count} GPU(s): start at most {count} processes per node"
    )]
    TooFewGpus {
        /// This process's local rank.
        local_rank: usize,
        /// The variable's value.
        visible: String,
        /// How many devices it lists.
        count: usize,
    },
    /// A `cuda:…` device whose index is not a number.
    #[error("device {0:?}: expected cuda or cuda:N with N a GPU index")]
    BadDevice(String),
}

/// The variables of one launcher (a row of the module table).
struct Group {
    source: Source,
    rank: &'static str,
    world: &'static str,
    local_rank: Option<&'static str>,
    local_world: Option<&'static str>,
}

const GROUPS: &[Group] = &[
    Group {
        source: Source::Rlvr,
        rank: "RLVR_RANK",
        world: "RLVR_WORLD_SIZE",
        local_rank: Some("RLVR_LOCAL_RANK"),
        local_world: Some("RLVR_LOCAL_WORLD_SIZE"),
    },
    Group {
        source: Source::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        world: "OMPI_COMM_WORLD_SIZE",
        local_rank: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
        local_world: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Group {
        source: Source::Pmi,
        rank: "PMI_RANK",
        world: "PMI_SIZE",
        local_rank: Some("MPI_LOCALRANKID"),
        local_world: Some("MPI_LOCALNRANKS"),
    },
    Group {
        source: Source::Pmix,
        rank: "PMIX_RANK",
        world: "SLURM_NTASKS",
        local_rank: Some("SLURM_LOCALID"),
        local_world: None,
    },
    Group {
        source: Source::Torchrun,
        rank: "RANK",
        world: "WORLD_SIZE",
        local_rank: Some("LOCAL_RANK"),
        local_world: Some("LOCAL_WORLD_SIZE"),
    },
    Group {
        source: Source::Slurm,
        rank: "SLURM_PROCID",
        world: "SLURM_NTASKS",
        local_rank: Some("SLURM_LOCALID"),
        local_world: None,
    },
];

fn group(s: Source) -> Option<&'static Group> {
    GROUPS.iter().find(|g| g.source == s)
}

/// A variable's value as a count or index: ASCII digits only, no sign, no blanks.
fn number(env: &BTreeMap<String, String>, var: &'static str) -> Result<Option<usize>, EnvError> {
    let Some(value) = env.get(var) else {
        return Ok(None);
    };
    let bad = || EnvError::NotANumber {
        var,
        value: value.clone(),
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    value.parse().map(Some).map_err(|_| bad())
}

/// One group's values, checked on their own.
fn read_group(env: &BTreeMap<String, String>, g: &Group) -> Result<Option<Launch>, EnvError> {
    // PMIx has no size variable of its own: only PMIX_RANK makes the group present.
    let rank = number(env, g.rank)?;
    let world = if g.source == Source::Pmix {
        if rank.is_none() {
            return Ok(None);
        }
        Some(number(env, g.world)?.ok_or(EnvError::NoWorldSize)?)
    } else {
        number(env, g.world)?
    };
    let (rank, world) = match (rank, world) {
        (None, None) => return Ok(None),
        (Some(_), None) => {
            return Err(EnvError::Missing {
                present: g.rank,
                missing: g.world,
            })
        }
        (None, Some(_)) => {
            return Err(EnvError::Missing {
                present: g.world,
                missing: g.rank,
            })
        }
        (Some(r), Some(w)) => (r, w),
    };
    if world == 0 {
        return Err(EnvError::ZeroSize { var: g.world });
    }
    if rank >= world {
        return Err(EnvError::OutOfRange {
            rank_var: g.rank,
            rank,
            size_var: g.world,
            size: world,
        });
    }
    let local_rank = match g.local_rank {
        Some(v) => number(env, v)?,
        None => None,
    };
    let local_world = match g.local_world {
        Some(v) => number(env, v)?,
        None => None,
    };
    if let (Some(v), Some(lw)) = (g.local_world, local_world) {
        if lw == 0 {
            return Err(EnvError::ZeroSize { var: v });
        }
        if lw > world {
            return Err(EnvError::Contradiction {
                a: v,
                a_value: lw,
                b: g.world,
                b_value: world,
                hint: "a node cannot hold more processes than the job",
            });
        }
    }
    if let (Some(v), Some(l)) = (g.local_rank, local_rank) {
        if let (Some(wv), Some(lw)) = (g.local_world, local_world) {
            if l >= lw {
                return Err(EnvError::OutOfRange {
                    rank_var: v,
                    rank: l,
                    size_var: wv,
                    size: lw,
                });
            }
        }
        if l >= world {
            return Err(EnvError::OutOfRange {
                rank_var: v,
                rank: l,
                size_var: g.world,
                size: world,
            });
        }
    }
    Ok(Some(Launch {
        rank,
        world_size: world,
        local_rank: local_rank.or((world == 1).then_some(0)),
        local_world_size: local_world.or((world == 1).then_some(1)),
        source: g.source,
    }))
}

fn agree(a: &Launch, b: &Launch, hint: &'static str, check_world: bool) -> Result<(), EnvError> {
    if a.rank != b.rank {
        return Err(EnvError::Contradiction {
            a: a.source.rank_var(),
            a_value: a.rank,
            b: b.source.rank_var(),
            b_value: b.rank,
            hint,
        });
    }
    if check_world && a.world_size != b.world_size {
        return Err(EnvError::Contradiction {
            a: a.source.world_var(),
            a_value: a.world_size,
            b: b.source.world_var(),
            b_value: b.world_size,
            hint,
        });
    }
    Ok(())
}

/// Resolves this process's [`Launch`] from an environment map (module docs: order, errors).
///
/// # Errors
/// [`EnvError`]: garbage values, half groups, out-of-range ranks, contradictions.
pub fn resolve(env: &BTreeMap<String, String>) -> Result<Launch, EnvError> {
    let read = |s: Source| read_group(env, group(s).expect("every source has a group"));
    let rlvr = read(Source::Rlvr)?;
    let ompi = read(Source::OpenMpi)?;
    let pmi = read(Source::Pmi)?;
    // OpenMPI 4 and 5 set PMIX_RANK beside OMPI_COMM_WORLD_*, without SLURM's size: PMIx is
    // read as a launcher only when no other MPI group is present.
    let pmix = if ompi.is_none() && pmi.is_none() {
        read(Source::Pmix)?
    } else {
        None
    };
    let torchrun = read(Source::Torchrun)?;
    let slurm = read(Source::Slurm)?;
    // The MPI family must agree with itself: two of them set means one launcher set both.
    if let (Some(a), Some(b)) = (&ompi, &pmi) {
        agree(
            a,
            b,
            "two MPI launchers' variables are set; unset the stale ones",
            true,
        )?;
    }
    if let (Some(a), Some(pmix_rank)) = (&ompi, number(env, "PMIX_RANK")?) {
        if a.rank != pmix_rank {
            return Err(EnvError::Contradiction {
                a: a.source.rank_var(),
                a_value: a.rank,
                b: "PMIX_RANK",
                b_value: pmix_rank,
                hint: "OpenMPI sets both to the same rank; unset the stale one",
            });
        }
    }
    if let (Some(p), Some(s)) = (&pmix, &slurm) {
        agree(p, s, "srun sets both to the same task id", false)?;
    }
    let launcher = ompi.or(pmi).or(pmix).or(torchrun).or(slurm);
    match (rlvr, launcher) {
        (None, None) => Ok(Launch::single()),
        (None, Some(l)) => Ok(l),
        (Some(r), None) => Ok(r),
        (Some(mut r), Some(l)) => {
            agree(
                &r,
                &l,
                "RLVR_RANK/RLVR_WORLD_SIZE override the launcher and must match it; unset them",
                true,
            )?;
            r.local_rank = r.local_rank.or(l.local_rank);
            r.local_world_size = r.local_world_size.or(l.local_world_size);
            Ok(r)
        }
    }
}

/// [`resolve`] over this process's environment (non-UTF-8 values are read lossily).
///
/// # Errors
/// As [`resolve`].
pub fn from_process_env() -> Result<Launch, EnvError> {
    let env: BTreeMap<String, String> = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    resolve(&env)
}

/// The device a rank uses for a configured `model.device`.
///
/// - `"cuda"` (no index) becomes `cuda:0` when `cuda_visible_devices` (the value of
///   `CUDA_VISIBLE_DEVICES`, if set) lists exactly one GPU (the launcher gave each rank its own),
///   and `cuda:{local rank}` otherwise.
/// - `"cuda:N"`, `"cpu"` and anything else are returned unchanged (an explicit index is the
///   user's choice, e.g. one `CUDA_VISIBLE_DEVICES` per rank).
///
/// # Errors
/// `cuda` with several ranks and no local rank ([`EnvError::NoLocalRank`]), with no visible GPU,
/// or with a local rank beyond the visible GPUs; `cuda:` followed by something that is not an
/// index.
pub fn device_for(
    spec: &str,
    launch: &Launch,
    cuda_visible_devices: Option<&str>,
) -> Result<String, EnvError> {
    if let Some(index) = spec.strip_prefix("cuda:") {
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(EnvError::BadDevice(spec.to_string()));
        }
        return Ok(spec.to_string());
    }
    if spec != "cuda" {
        return Ok(spec.to_string());
    }
    let visible =
        cuda_visible_devices.map(|v| (v, v.split(',').filter(|s| !s.trim().is_empty()).count()));
    if let Some((v, 0)) = visible {
        return Err(EnvError::NoVisibleGpu(v.to_string()));
    }
    if let Some((_, 1)) = visible {
        return Ok("cuda:0".to_string());
    }
    let local = match launch.local_rank {
        Some(l) => l,
        None if launch.world_size == 1 => 0,
        None => {
            return Err(EnvError::NoLocalRank {
                rank: launch.rank,
                world_size: launch.world_size,
                launcher: launch.source,
            })
        }
    };
    if let Some((v, count)) = visible {
        if local >= count {
            return Err(EnvError::TooFewGpus {
                local_rank: local,
                visible: v.to_string(),
                count,
            });
        }
    }
    Ok(format!("cuda:{local}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ok(pairs: &[(&str, &str)]) -> Launch {
        resolve(&env(pairs)).unwrap_or_else(|e| panic!("{pairs:?}: {e}"))
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        match resolve(&env(pairs)) {
            Ok(l) => panic!("{pairs:?} resolved to {l:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn l(
        rank: usize,
        world: usize,
        local: Option<usize>,
        source: Source,
    ) -> (usize, usize, Option<usize>, Source) {
        (rank, world, local, source)
    }

    fn key(x: &Launch) -> (usize, usize, Option<usize>, Source) {
        (x.rank, x.world_size, x.local_rank, x.source)
    }

    #[test]
    fn no_launcher_is_one_process() {
        assert_eq!(ok(&[]), Launch::single());
        // Unrelated variables and local-only variables do not make a group.
        assert_eq!(
            ok(&[("HOME", "/root"), ("LOCAL_RANK", "3")]),
            Launch::single()
        );
        assert_eq!(Launch::single().to_string(), "rank 0 of 1, local rank 0");
    }

    #[test]
    fn each_launcher_alone() {
        let cases: &[(&[(&str, &str)], _)] = &[
            (
                &[("RLVR_RANK", "1"), ("RLVR_WORLD_SIZE", "2")],
                l(1, 2, None, Source::Rlvr),
            ),
            (
                &[
                    ("RLVR_RANK", "1"),
                    ("RLVR_WORLD_SIZE", "2"),
                    ("RLVR_LOCAL_RANK", "1"),
                ],
                l(1, 2, Some(1), Source::Rlvr),
            ),
            (
                &[
                    ("OMPI_COMM_WORLD_RANK", "3"),
                    ("OMPI_COMM_WORLD_SIZE", "8"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
                ],
                l(3, 8, Some(3), Source::OpenMpi),
            ),
            (
                &[
                    ("PMI_RANK", "5"),
                    ("PMI_SIZE", "16"),
                    ("MPI_LOCALRANKID", "5"),
                ],
                l(5, 16, Some(5), Source::Pmi),
            ),
            (
                &[
                    ("PMIX_RANK", "9"),
                    ("SLURM_PROCID", "9"),
                    ("SLURM_NTASKS", "16"),
                    ("SLURM_LOCALID", "1"),
                ],
                l(9, 16, Some(1), Source::Pmix),
            ),
            (
                &[
                    ("RANK", "7"),
                    ("WORLD_SIZE", "8"),
                    ("LOCAL_RANK", "7"),
                    ("LOCAL_WORLD_SIZE", "8"),
                ],
                l(7, 8, Some(7), Source::Torchrun),
            ),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "1")],
                l(0, 1, Some(0), Source::Torchrun),
            ),
            (
                &[
                    ("SLURM_PROCID", "2"),
                    ("SLURM_NTASKS", "4"),
                    ("SLURM_LOCALID", "0"),
                ],
                l(2, 4, Some(0), Source::Slurm),
            ),
        ];
        for (pairs, want) in cases {
            assert_eq!(key(&ok(pairs)), *want, "{pairs:?}");
        }
    }

    #[test]
    fn the_first_group_wins_and_lower_ones_may_differ() {
        // mpirun -np 2 inside a 4-task SLURM allocation.
        let x = ok(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "0"),
        ]);
        assert_eq!(key(&x), l(1, 2, Some(1), Source::OpenMpi));
        assert_eq!(
            x.to_string(),
            "rank 1 of 2, local rank 1 (from OMPI_COMM_WORLD_RANK)"
        );
        // srun starting torchrun: SLURM counts nodes' agents, torchrun counts workers.
        let x = ok(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_RANK", "5"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
        ]);
        assert_eq!(key(&x), l(5, 16, Some(5), Source::Torchrun));
        // MPI before torchrun.
        let x = ok(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
        ]);
        assert_eq!(x.source, Source::Pmi);
        // OpenMPI sets PMIX_RANK too (no SLURM size needed); OMPI comes first, the ranks agree,
        // and an allocation's SLURM_PROCID may differ.
        let x = ok(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("PMIX_RANK", "1"),
        ]);
        assert_eq!(key(&x), l(1, 2, None, Source::OpenMpi));
        let x = ok(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("PMIX_RANK", "1"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_PROCID", "0"),
        ]);
        assert_eq!(x.source, Source::OpenMpi);
        assert_eq!(x.world_size, 3);
    }

    #[test]
    fn the_override_must_match_the_launcher_and_borrows_its_local_rank() {
        let x = ok(&[
            ("RLVR_RANK", "1"),
            ("RLVR_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ]);
        assert_eq!(key(&x), l(1, 2, Some(1), Source::Rlvr));
        let e = err(&[
            ("RLVR_RANK", "0"),
            ("RLVR_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
        ]);
        assert!(
            e.contains("RLVR_WORLD_SIZE=4 contradicts OMPI_COMM_WORLD_SIZE=2"),
            "{e}"
        );
        let e = err(&[
            ("RLVR_RANK", "1"),
            ("RLVR_WORLD_SIZE", "2"),
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
        ]);
        assert!(e.contains("RLVR_RANK=1 contradicts RANK=0"), "{e}");
    }

    #[test]
    fn mpi_variables_must_agree_with_each_other() {
        let e = err(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
        ]);
        assert!(
            e.contains("OMPI_COMM_WORLD_RANK=0 contradicts PMI_RANK=1"),
            "{e}"
        );
        let e = err(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "3"),
        ]);
        assert!(
            e.contains("OMPI_COMM_WORLD_SIZE=2 contradicts PMI_SIZE=3"),
            "{e}"
        );
        let e = err(&[
            ("PMIX_RANK", "2"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
        ]);
        assert!(e.contains("PMIX_RANK=2 contradicts SLURM_PROCID=3"), "{e}");
        let e = err(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("PMIX_RANK", "1"),
        ]);
        assert!(
            e.contains("OMPI_COMM_WORLD_RANK=0 contradicts PMIX_RANK=1"),
            "{e}"
        );
    }

    #[test]
    fn garbage_values_name_the_variable() {
        for bad in [
            "two",
            "-1",
            "",
            " 1",
            "1 ",
            "1.5",
            "0x2",
            "+1",
            "99999999999999999999999",
        ] {
            let e = err(&[("RANK", bad), ("WORLD_SIZE", "4")]);
            assert_eq!(e, format!("RANK={bad:?} is not a non-negative integer"));
            let e = err(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", bad)]);
            assert!(e.starts_with("OMPI_COMM_WORLD_SIZE="), "{e}");
        }
        // Garbage in a lower group is still an error: it is read, so it must parse.
        let e = err(&[
            ("RLVR_RANK", "0"),
            ("RLVR_WORLD_SIZE", "1"),
            ("SLURM_NTASKS", "x"),
        ]);
        assert!(e.contains("SLURM_NTASKS=\"x\""), "{e}");
        let e = err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "gpu0")]);
        assert!(e.contains("LOCAL_RANK=\"gpu0\""), "{e}");
    }

    #[test]
    fn half_groups_and_ranges_are_errors() {
        assert_eq!(
            err(&[("RANK", "0")]),
            "RANK is set but WORLD_SIZE is not: a launcher sets both, so set or unset them together"
        );
        assert!(err(&[("WORLD_SIZE", "2")]).starts_with("WORLD_SIZE is set but RANK is not"));
        assert!(err(&[("RLVR_WORLD_SIZE", "2")]).contains("RLVR_RANK is not"));
        assert!(err(&[("SLURM_PROCID", "0")]).contains("SLURM_NTASKS is not"));
        assert_eq!(
            err(&[("RANK", "0"), ("WORLD_SIZE", "0")]),
            "WORLD_SIZE=0: a world has at least one process"
        );
        assert_eq!(
            err(&[("RANK", "2"), ("WORLD_SIZE", "2")]),
            "RANK=2 is not below WORLD_SIZE=2"
        );
        assert_eq!(
            err(&[
                ("RANK", "1"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_RANK", "2"),
                ("LOCAL_WORLD_SIZE", "2")
            ]),
            "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"
        );
        assert!(
            err(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "2")])
                .contains("LOCAL_RANK=2 is not below WORLD_SIZE=2")
        );
        assert!(err(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "4")
        ])
        .contains("LOCAL_WORLD_SIZE=4 contradicts WORLD_SIZE=2"));
        assert!(err(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "0")
        ])
        .contains("LOCAL_WORLD_SIZE=0"));
        let e = err(&[("PMIX_RANK", "0")]);
        assert!(e.contains("set RLVR_WORLD_SIZE"), "{e}");
        assert!(err(&[("PMIX_RANK", "4"), ("SLURM_NTASKS", "4")])
            .contains("PMIX_RANK=4 is not below SLURM_NTASKS=4"));
    }

    #[test]
    fn from_process_env_reads_something_sane() {
        // The test runner's environment (cargo test, or a launcher in CI): whatever it is, it
        // resolves or names its problem, and never panics.
        match from_process_env() {
            Ok(l) => assert!(l.rank < l.world_size),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn device_rule() {
        let one = Launch::single();
        let r3 = ok(&[
            ("OMPI_COMM_WORLD_RANK", "11"),
            ("OMPI_COMM_WORLD_SIZE", "16"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
        ]);
        let nolocal = ok(&[("PMI_RANK", "1"), ("PMI_SIZE", "2")]);
        assert_eq!(device_for("cuda", &one, None).unwrap(), "cuda:0");
        assert_eq!(device_for("cuda", &r3, None).unwrap(), "cuda:3");
        assert_eq!(
            device_for("cuda", &r3, Some("0,1,2,3,4,5,6,7")).unwrap(),
            "cuda:3"
        );
        // srun --gpus-per-task=1: each rank sees exactly its own GPU.
        assert_eq!(device_for("cuda", &r3, Some("5")).unwrap(), "cuda:0");
        assert_eq!(
            device_for("cuda", &nolocal, Some("GPU-8f3a")).unwrap(),
            "cuda:0"
        );
        // Explicit devices are the user's choice.
        assert_eq!(device_for("cuda:1", &r3, None).unwrap(), "cuda:1");
        assert_eq!(device_for("cpu", &r3, Some("")).unwrap(), "cpu");
        assert_eq!(device_for("metal", &r3, None).unwrap(), "metal");
        let e = device_for("cuda", &nolocal, None).unwrap_err().to_string();
        assert!(
            e.contains("no local rank") && e.contains("RLVR_LOCAL_RANK"),
            "{e}"
        );
        let e = device_for("cuda", &r3, Some("0,1"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("local rank 3") && e.contains("only 2 GPU"),
            "{e}"
        );
        assert!(matches!(
            device_for("cuda", &r3, Some("")),
            Err(EnvError::NoVisibleGpu(_))
        ));
        assert!(matches!(
            device_for("cuda", &one, Some(" , ")),
            Err(EnvError::NoVisibleGpu(_))
        ));
        for bad in ["cuda:", "cuda:x", "cuda:-1", "cuda:0,1"] {
            assert_eq!(
                device_for(bad, &one, None),
                Err(EnvError::BadDevice(bad.to_string()))
            );
        }
    }
}
