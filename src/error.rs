//! The one error type of the crate.

use std::fmt;

/// Everything that can go wrong in mmcid, each variant naming the problem (I9).
///
/// ```
/// let err = mmcid::CpuSet::from_cpus(Vec::<usize>::new()).unwrap_err();
/// assert_eq!(err, mmcid::Error::EmptyCpuSet);
/// assert_eq!(err.to_string(), "the CPU set is empty");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A CPU set with no CPU in it.
    EmptyCpuSet,
    /// A CPU number at or beyond the machine's possible CPUs (or the group's virtual CPUs).
    CpuOutOfRange {
        /// The CPU asked for.
        cpu: usize,
        /// How many CPUs are possible.
        possible: usize,
    },
    /// A CPU the process may not run on: outside the affinity masks of the calling thread and of the process's
    /// main thread.
    CpuNotAllowed {
        /// The CPU asked for.
        cpu: usize,
    },
    /// The OS refused to pin a thread, or the thread did not land on the requested CPU.
    PinFailed {
        /// The CPU asked for.
        cpu: usize,
        /// What the OS said.
        reason: String,
    },
    /// A request for zero threads (e.g. `threads_per_cpu(0)`) or zero virtual CPUs.
    ZeroThreads,
    /// A runtime CPU that the group it was given may not use.
    CpuNotInGroup {
        /// The runtime CPU missing from the group's allowed set.
        cpu: usize,
    },
    /// A guard of one group used with data that belongs to another group.
    ForeignGuard,
    /// The group cannot take more registrations: its CID space is at its hard size.
    TooManyRegistrations {
        /// The hard limit on registrations.
        limit: usize,
    },
    /// An OS call failed.
    Os {
        /// What was being done.
        what: &'static str,
        /// The OS error number.
        errno: i32,
    },
    /// A thread could not be spawned.
    Spawn {
        /// What the OS said.
        reason: String,
    },
    /// A runtime thread called `join` on its own handle (it would wait for itself forever).
    JoinSelf,
    /// A numeric setting outside the range it accepts.
    ValueOutOfRange {
        /// The setting, e.g. `"virtual_cpus"`.
        what: &'static str,
        /// The value given.
        value: usize,
        /// The smallest value accepted.
        min: usize,
        /// The largest value accepted (`usize::MAX`: no upper limit of its own).
        max: usize,
    },
}

impl Error {
    /// `Ok(value)` if `min <= value <= max`, else [`Error::ValueOutOfRange`] naming `what`.
    pub(crate) fn check_range(what: &'static str, value: usize, min: usize, max: usize) -> Result<usize, Error> {
        if (min..=max).contains(&value) {
            Ok(value)
        } else {
            Err(Error::ValueOutOfRange { what, value, min, max })
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::EmptyCpuSet => write!(f, "the CPU set is empty"),
            Error::CpuOutOfRange { cpu, possible } => {
                write!(f, "CPU {cpu} is out of range: only {possible} CPUs are possible")
            }
            Error::CpuNotAllowed { cpu } => {
                write!(f, "CPU {cpu} is in neither the calling thread's affinity mask nor the process's main thread's")
            }
            Error::PinFailed { cpu, reason } => write!(f, "could not pin a thread to CPU {cpu}: {reason}"),
            Error::ZeroThreads => write!(f, "zero threads (or zero CPUs) were requested"),
            Error::CpuNotInGroup { cpu } => {
                write!(f, "CPU {cpu} is used by the runtime but not allowed in its group")
            }
            Error::ForeignGuard => write!(f, "the guard belongs to another group"),
            Error::TooManyRegistrations { limit } => {
                write!(f, "the group already has the maximum of {limit} registrations")
            }
            Error::Os { what, errno } => write!(f, "{what} failed with OS error {errno}"),
            Error::Spawn { reason } => write!(f, "could not spawn a thread: {reason}"),
            Error::JoinSelf => write!(f, "a runtime thread cannot join itself"),
            Error::ValueOutOfRange { what, value, min, max } if *max == usize::MAX => {
                write!(f, "{what} is {value}, below the minimum of {min}")
            }
            Error::ValueOutOfRange { what, value, min, max } => {
                write!(f, "{what} is {value}, outside the accepted range {min}..={max}")
            }
        }
    }
}

impl std::error::Error for Error {}
