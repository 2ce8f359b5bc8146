//! Running many cases and summarising the outcome.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use crate::{Arch, Case, Gpu, cases};

/// Makes a fresh device (a new context) for one case run; `Err` is a `CUresult`.
pub type GpuFactory<'a> = dyn FnMut() -> Result<Box<dyn Gpu>, i32> + 'a;

/// The result of one case on one architecture.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Case name.
    pub case: &'static str,
    /// Its `.cu` file stem.
    pub file: &'static str,
    /// Which fixture ran.
    pub arch: Arch,
    /// `None` on success, otherwise what went wrong.
    pub error: Option<String>,
    /// Wall time, including module load and all transfers.
    pub elapsed: Duration,
}

/// Outcomes of a corpus run, printable as a summary table.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// One entry per (case, arch), in run order.
    pub outcomes: Vec<Outcome>,
}

impl Report {
    /// How many runs passed.
    pub fn passed(&self) -> usize {
        self.outcomes.iter().filter(|o| o.error.is_none()).count()
    }

    /// How many runs failed.
    pub fn failed(&self) -> usize {
        self.outcomes.len() - self.passed()
    }

    /// The failed runs.
    pub fn failures(&self) -> impl Iterator<Item = &Outcome> {
        self.outcomes.iter().filter(|o| o.error.is_some())
    }
}

impl fmt::Display for Report {
    /// One row per case with a column per architecture, then the failure
    /// messages, then a `corpus: N passed, M failed` line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut archs: Vec<Arch> = self.outcomes.iter().map(|o| o.arch).collect();
        archs.sort();
        archs.dedup();
        let mut names: Vec<&'static str> = Vec::new();
        for o in &self.outcomes {
            if !names.contains(&o.case) {
                names.push(o.case);
            }
        }
        let width = names.iter().map(|n| n.len()).max().unwrap_or(4).max(4);
        write!(f, "{:width$}", "case")?;
        for a in &archs {
            write!(f, "  {:>14}", a.suffix())?;
        }
        writeln!(f)?;
        for name in &names {
            write!(f, "{name:width$}")?;
            for a in &archs {
                let cell = match self
                    .outcomes
                    .iter()
                    .find(|o| o.case == *name && o.arch == *a)
                {
                    None => "-".to_string(),
                    Some(o) if o.error.is_none() => {
                        format!("ok {:>7.1}ms", o.elapsed.as_secs_f64() * 1e3)
                    }
                    Some(_) => "FAIL".to_string(),
                };
                write!(f, "  {cell:>14}")?;
            }
            writeln!(f)?;
        }
        for o in self.failures() {
            writeln!(
                f,
                "FAIL {} [{}]: {}",
                o.case,
                o.arch,
                o.error.as_deref().unwrap_or("")
            )?;
        }
        writeln!(
            f,
            "corpus: {} passed, {} failed",
            self.passed(),
            self.failed()
        )
    }
}

/// Runs every case on every architecture in `archs`, each on a fresh device
/// from `factory` (so a case that poisons its context cannot affect another).
/// A case that panics is recorded as a failure.
pub fn run_all(factory: &mut GpuFactory<'_>, archs: &[Arch]) -> Report {
    run_cases(&cases(), factory, archs)
}

/// Like [`run_all`] for a chosen subset of cases.
pub fn run_cases(cases: &[Case], factory: &mut GpuFactory<'_>, archs: &[Arch]) -> Report {
    let mut report = Report::default();
    for &arch in archs {
        for case in cases {
            let start = Instant::now();
            let error = match factory() {
                Err(code) => Some(format!("creating the device failed with CUresult {code}")),
                Ok(mut gpu) => {
                    match catch_unwind(AssertUnwindSafe(|| (case.run)(gpu.as_mut(), arch))) {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(e.to_string()),
                        Err(panic) => Some(format!("panicked: {}", panic_message(panic.as_ref()))),
                    }
                }
            };
            report.outcomes.push(Outcome {
                case: case.name,
                file: case.file,
                arch,
                error,
                elapsed: start.elapsed(),
            });
        }
    }
    report
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
