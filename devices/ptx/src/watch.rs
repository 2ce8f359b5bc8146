//! Module loads that stop on time: [`LoadWatch`] is asked every so often while PTX is
//! tokenized, parsed and decoded, so that a load can be cut at a deadline or cancelled when its
//! requester has gone, however long the module would take.

use crate::error::{LoadError, LoadErrorKind};

/// Units of work (tokens, statements, instructions, blocks visited) between two questions to
/// the watch: a few tens of microseconds of loading.
const CHECK_UNITS: u64 = 4096;

/// Says whether a module load must stop now.
pub trait LoadWatch {
    /// `Some(LoadErrorKind::TimedOut)` or `Some(LoadErrorKind::Cancelled)` to stop the load;
    /// `None` to go on.
    fn check(&mut self) -> Option<LoadErrorKind>;
}

impl<F: FnMut() -> Option<LoadErrorKind>> LoadWatch for F {
    fn check(&mut self) -> Option<LoadErrorKind> {
        self()
    }
}

/// Counts a load's work and asks the watch every [`CHECK_UNITS`].
pub(crate) struct Ticker<'a> {
    watch: Option<&'a mut dyn LoadWatch>,
    units: u64,
}

impl<'a> Ticker<'a> {
    /// A ticker that never stops the load.
    pub(crate) fn none() -> Ticker<'static> {
        Ticker {
            watch: None,
            units: 0,
        }
    }

    /// A ticker asking `watch`.
    pub(crate) fn new(watch: &'a mut dyn LoadWatch) -> Ticker<'a> {
        Ticker {
            watch: Some(watch),
            units: 0,
        }
    }

    /// Counts `units` of work done around PTX line `line`; fails when the watch says stop.
    pub(crate) fn tick(&mut self, units: u64, line: usize) -> Result<(), LoadError> {
        self.units = self.units.saturating_add(units);
        if self.units < CHECK_UNITS {
            return Ok(());
        }
        self.units = 0;
        let Some(w) = self.watch.as_deref_mut() else {
            return Ok(());
        };
        match w.check() {
            None => Ok(()),
            Some(kind) => Err(LoadError {
                kind,
                line,
                message: match kind {
                    LoadErrorKind::Cancelled => "the module load was cancelled".into(),
                    _ => "the module load ran past its deadline".into(),
                },
            }),
        }
    }
}
