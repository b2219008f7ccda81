//! The progress display on stderr (`indicatif`), drawn only when stderr is
//! a terminal: a line for the whole invocation (elapsed time, a bar of the
//! planned operations done, which run of how many, the time left) and a
//! line for the run in progress (engine, workload, threads, repetition,
//! its operations done of planned).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress of a benchmark invocation.
pub(crate) struct Progress {
    multi: MultiProgress,
    total: ProgressBar,
    run: ProgressBar,
    enabled: bool,
    runs: usize,
    started: usize,
    /// Planned operations of the runs started so far.
    planned: u64,
}

/// What the worker threads of one run report their operations to.
#[derive(Clone)]
pub(crate) struct Meter {
    total: ProgressBar,
    run: ProgressBar,
}

impl Meter {
    /// Counts `n` more operations done.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.run.inc(n);
        self.total.inc(n);
    }
}

impl Progress {
    /// The display for `runs` runs of `total_ops` planned operations in
    /// all, shown only if stderr is a terminal.
    pub(crate) fn new(runs: usize, total_ops: u64) -> Progress {
        let enabled = std::io::stderr().is_terminal();
        let target = if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let multi = MultiProgress::with_draw_target(target);
        let total = multi.add(ProgressBar::new(total_ops.max(1)));
        total.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30.cyan/blue}] {percent:>3}%  {msg}  time left {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        let run = multi.add(ProgressBar::new(1));
        run.set_style(
            ProgressStyle::with_template("  {prefix}  [{bar:20}] {human_pos}/{human_len} ops")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        if enabled {
            total.enable_steady_tick(Duration::from_millis(250));
        }
        Progress {
            multi,
            total,
            run,
            enabled,
            runs,
            started: 0,
            planned: 0,
        }
    }

    /// Starts the next run, described by `what` (engine, workload,
    /// threads, repetition), of `ops` planned operations; returns the
    /// meter its threads count their operations on.
    pub(crate) fn start_run(&mut self, what: &str, ops: u64) -> Meter {
        self.started += 1;
        // Operations a finished run did not report (it failed, or it
        // counts its work otherwise) are counted as done.
        self.total.set_position(self.planned);
        self.planned += ops;
        self.total
            .set_message(format!("run {}/{}", self.started, self.runs));
        self.run.set_prefix(what.to_string());
        self.run.set_length(ops.max(1));
        self.run.reset();
        Meter {
            total: self.total.clone(),
            run: self.run.clone(),
        }
    }

    /// Shows a transient status line (replaced by the next run's).
    pub(crate) fn note(&mut self, msg: &str) {
        self.total.set_message(msg.to_string());
    }

    /// Prints a message that stays, whether or not the bars are shown.
    pub(crate) fn warn(&mut self, msg: &str) {
        if self.enabled {
            self.multi.suspend(|| eprintln!("{msg}"));
        } else {
            eprintln!("{msg}");
        }
    }

    /// Clears the bars.
    pub(crate) fn finish(&mut self) {
        self.run.finish_and_clear();
        self.total.finish_and_clear();
        let _ = self.multi.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_runs_and_operations() {
        let mut p = Progress::new(2, 300);
        let m = p.start_run("a insert, 1 thread, repeat 1/1", 100);
        m.add(60);
        assert_eq!((p.run.position(), p.total.position()), (60, 60));
        let m = p.start_run("a get-pos, 1 thread, repeat 1/1", 200);
        // The first run's 40 unreported operations count as done.
        assert_eq!((p.run.position(), p.total.position()), (0, 100));
        m.add(200);
        assert_eq!(p.total.position(), 300);
        assert_eq!(p.total.message(), "run 2/2");
        p.finish();
    }
}
