//! Progress of long work on a terminal: a spinner or a timed bar on stderr while a case, a row
//! or a run is measured, cleared when it ends. Nothing is drawn when stderr is not a terminal
//! or the output is JSON, so piped and machine-readable output stay as they were.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A spinner or timed bar, cleared when dropped.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// A spinner saying `what` (with the time spent), unless `quiet`.
    pub fn spinner(what: impl Into<String>, quiet: bool) -> Progress {
        let Some(pb) = bar(None, quiet) else {
            return Progress(None);
        };
        pb.set_style(
            ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        pb.set_message(what.into());
        Progress(Some(pb))
    }

    /// A bar that fills over `total` (a run of a set duration), unless `quiet`.
    pub fn timed(what: impl Into<String>, total: Duration, quiet: bool) -> Progress {
        let ms = u64::try_from(total.as_millis()).unwrap_or(u64::MAX).max(1);
        let Some(pb) = bar(Some(ms), quiet) else {
            return Progress(None);
        };
        pb.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {elapsed} of {len_s}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .with_key(
                    "len_s",
                    |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                        let _ = write!(w, "{}s", s.len().unwrap_or(0) / 1000);
                    },
                ),
        );
        pb.set_message(what.into());
        let tick = pb.clone();
        // The bar follows the clock; its thread ends when the bar is finished.
        std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            while !tick.is_finished() {
                tick.set_position(
                    u64::try_from(t0.elapsed().as_millis())
                        .unwrap_or(u64::MAX)
                        .min(ms),
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        Progress(Some(pb))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(pb) = self.0.take() {
            pb.finish_and_clear();
        }
    }
}

fn bar(len: Option<u64>, quiet: bool) -> Option<ProgressBar> {
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr());
    pb.enable_steady_tick(Duration::from_millis(120));
    Some(pb)
}
