//! Why a benchmark could not run, and the exit status that says so.

use std::fmt;

/// Why `bench` failed.
#[derive(Debug)]
pub enum BenchError {
    /// The command line asks for something impossible (exit status 2).
    Usage(String),
    /// Setting up or running failed (exit status 1).
    Failed {
        /// What was being done.
        during: String,
        /// What went wrong, with the context an operator needs.
        detail: String,
    },
}

impl BenchError {
    /// A failure while doing `during`.
    pub fn failed(during: impl Into<String>, detail: impl fmt::Display) -> Self {
        BenchError::Failed {
            during: during.into(),
            detail: detail.to_string(),
        }
    }

    /// The process exit status: 2 for usage errors, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::Usage(_) => 2,
            BenchError::Failed { .. } => 1,
        }
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Usage(s) => f.write_str(s),
            BenchError::Failed { during, detail } => write!(f, "{during}: {detail}"),
        }
    }
}

impl std::error::Error for BenchError {}
