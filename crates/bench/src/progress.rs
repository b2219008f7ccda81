//! A hand-written progress bar on stderr, drawn only when stderr is a
//! terminal; it ticks once per run (engine × workload × threads × repeat).

use std::io::{IsTerminal, Write};
use std::time::Instant;

const BAR: usize = 24;

/// Progress of a benchmark invocation.
pub(crate) struct Progress {
    total: usize,
    done: usize,
    enabled: bool,
    started: Instant,
}

impl Progress {
    /// A bar for `total` runs, shown only if stderr is a terminal.
    pub(crate) fn new(total: usize) -> Progress {
        Progress {
            total,
            done: 0,
            enabled: std::io::stderr().is_terminal(),
            started: Instant::now(),
        }
    }

    /// Starts the next run, described by `label`.
    pub(crate) fn tick(&mut self, label: &str) {
        let done = self.done;
        self.done += 1;
        if !self.enabled {
            return;
        }
        let filled = (done * BAR)
            .checked_div(self.total)
            .map_or(BAR, |f| f.min(BAR));
        let line = format!(
            "[{}{}] {}/{} {:>4}s  {label}",
            "#".repeat(filled),
            "-".repeat(BAR - filled),
            self.done,
            self.total,
            self.started.elapsed().as_secs()
        );
        self.draw(&line);
    }

    /// Shows a transient status line (replaced by the next tick).
    pub(crate) fn note(&mut self, msg: &str) {
        if self.enabled {
            self.draw(msg);
        }
    }

    /// Prints a message that stays, whether or not the bar is shown.
    pub(crate) fn warn(&mut self, msg: &str) {
        let mut err = std::io::stderr().lock();
        if self.enabled {
            let _ = write!(err, "\r\x1b[2K");
        }
        let _ = writeln!(err, "{msg}");
    }

    /// Clears the bar.
    pub(crate) fn finish(&mut self) {
        if self.enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }

    fn draw(&self, line: &str) {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
    }
}
