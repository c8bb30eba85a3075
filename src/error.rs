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
    /// A request for zero threads (`RuntimeBuilder::threads_per_cpu(0)`).
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
            Error::ZeroThreads => write!(f, "zero threads were requested"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_range_accepts_both_ends_and_names_what_it_refuses() {
        assert_eq!(Error::check_range("stack_size", 64, 64, 128), Ok(64));
        assert_eq!(Error::check_range("stack_size", 128, 64, 128), Ok(128));
        let below = Error::check_range("stack_size", 63, 64, 128).unwrap_err();
        assert_eq!(below, Error::ValueOutOfRange { what: "stack_size", value: 63, min: 64, max: 128 });
        assert_eq!(below.to_string(), "stack_size is 63, outside the accepted range 64..=128");
        let above = Error::check_range("virtual_cpus", 70_000, 1, 65_536).unwrap_err();
        assert!(above.to_string().contains("virtual_cpus is 70000"), "{above}");
        let no_max = Error::check_range("threads_per_cpu", 0, 1, usize::MAX).unwrap_err();
        assert_eq!(no_max.to_string(), "threads_per_cpu is 0, below the minimum of 1");
    }

    /// Every message names its subject (the numbers a user needs to fix the call), and no two variants print
    /// the same text.
    #[test]
    fn every_message_names_the_problem() {
        let all = [
            (Error::EmptyCpuSet, "empty"),
            (Error::CpuOutOfRange { cpu: 9, possible: 4 }, "CPU 9"),
            (Error::CpuNotAllowed { cpu: 3 }, "CPU 3"),
            (Error::PinFailed { cpu: 2, reason: "EINVAL".into() }, "EINVAL"),
            (Error::ZeroThreads, "zero threads"),
            (Error::CpuNotInGroup { cpu: 5 }, "CPU 5"),
            (Error::ForeignGuard, "another group"),
            (Error::TooManyRegistrations { limit: 42 }, "42"),
            (Error::Os { what: "sched_setaffinity", errno: 22 }, "sched_setaffinity"),
            (Error::Spawn { reason: "EAGAIN".into() }, "EAGAIN"),
            (Error::JoinSelf, "join itself"),
            (Error::ValueOutOfRange { what: "stack_size", value: 1, min: 2, max: 3 }, "stack_size"),
        ];
        let mut texts: Vec<String> = all.iter().map(|(e, _)| e.to_string()).collect();
        for ((e, needle), text) in all.iter().zip(&texts) {
            assert!(text.contains(needle), "{e:?} prints {text:?}, which does not name {needle:?}");
        }
        texts.sort();
        texts.dedup();
        assert_eq!(texts.len(), all.len(), "two variants print the same message");
    }
}
